"""The example domains `counter` and `todos` in Python, reaching the same canonical states as Swift's.

docs/ do not define the example domains; their states, actions, validators and reducers are taken from
Sources/LockstepExamples/Counter.swift and Todos.swift (see README.md, "Spec findings").

A state is kept as the JSON value Swift's Codable writes for it (dicts, lists, str, int, bool), so its
canonical bytes are `lockstep_wire.canonical_json(state)`. Actions are decoded from JSON the way Swift's
synthesized Codable reads them: one key naming the case, an object of its labelled values (unknown members
ignored; a duplicate member: the first one counts), integers that are integral and within Int64.
"""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from typing import Any, Dict

from lockstep_wire import INT64_MAX, INT64_MIN, canonical_json, digest


class Undecodable(Exception):
    """The bytes are not an action (or a state) of the domain."""


class Rejection(Exception):
    """The domain's validator refused the action."""

    def __init__(self, code: str, reason: str):
        super().__init__(f"{reason} [{code}]")
        self.code = code
        self.reason = reason


def _first_wins(pairs):
    result: Dict[str, Any] = {}
    for key, value in pairs:
        result.setdefault(key, value)
    return result


def _int_from_float_text(text: str):
    return Decimal(text)


def parse_json(raw: bytes) -> Any:
    """JSON as the domains read it; numbers with a fraction or exponent stay Decimals until a field asks."""
    try:
        text = bytes(raw).decode("utf-8")
        return json.loads(text, object_pairs_hook=_first_wins, parse_float=_int_from_float_text)
    except (UnicodeDecodeError, ValueError) as error:
        raise Undecodable(f"not valid JSON: {error}") from None


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise Undecodable(f"expected Int at {where}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, Decimal):
        if value != value.to_integral_value():
            raise Undecodable(f"expected Int at {where}")
        number = int(value)
    else:
        raise Undecodable(f"expected Int at {where}")
    if not INT64_MIN <= number <= INT64_MAX:
        raise Undecodable(f"Int at {where} is out of range")
    return number


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise Undecodable(f"expected String at {where}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Undecodable(f"String at {where} is not Unicode (a lone surrogate)") from None
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise Undecodable(f"expected Bool at {where}")
    return value


def _object(value: Any, where: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise Undecodable(f"expected an object at {where}")
    return value


def _case(value: Any, cases) -> tuple:
    """An enum with associated values: exactly one member, naming a case, holding an object."""
    value = _object(value, "the top level")
    if len(value) != 1:
        raise Undecodable(f"expected exactly one key (the case) at the top level, found {len(value)}")
    (name, payload), = value.items()
    if name not in cases:
        raise Undecodable(f"no case named {name!r}")
    return name, _object(payload, name)


class Domain:
    name = ""
    version = 1

    @classmethod
    def initial_state(cls) -> Any:
        raise NotImplementedError

    @classmethod
    def decode_action(cls, raw: bytes) -> Any:
        raise NotImplementedError

    @classmethod
    def decode_state(cls, raw: bytes) -> Any:
        raise NotImplementedError

    @classmethod
    def validate(cls, action: Any, state: Any) -> None:
        raise NotImplementedError

    @classmethod
    def reduce(cls, state: Any, action: Any) -> None:
        raise NotImplementedError

    @classmethod
    def encode(cls, value: Any) -> bytes:
        """Canonical JSON of a state or an action."""
        return canonical_json(value)

    @classmethod
    def digest(cls, state: Any) -> bytes:
        return digest(canonical_json(state))

    @classmethod
    def copy(cls, state: Any) -> Any:
        return copy.deepcopy(state)


class Counter(Domain):
    """State {"count": Int}; actions {"increment":{}}, {"decrement":{}}."""

    name = "counter"
    version = 1

    @classmethod
    def initial_state(cls):
        return {"count": 0}

    @classmethod
    def decode_action(cls, raw):
        case, _ = _case(parse_json(raw), ("increment", "decrement"))
        return {case: {}}

    @classmethod
    def decode_state(cls, raw):
        value = _object(parse_json(raw), "the top level")
        if "count" not in value:
            raise Undecodable("missing key 'count'")
        return {"count": _int(value["count"], "count")}

    @classmethod
    def validate(cls, action, state):
        if "increment" in action and state["count"] == INT64_MAX:
            raise Rejection("overflow", f"counter: cannot increment past {INT64_MAX}")
        if "decrement" in action and state["count"] == INT64_MIN:
            raise Rejection("overflow", f"counter: cannot decrement below {INT64_MIN}")

    @classmethod
    def reduce(cls, state, action):
        state["count"] += 1 if "increment" in action else -1


class Todos(Domain):
    """State {"filter": F, "list": {"items": [{"completed","id","text"}], "nextID": Int}};
    actions {"add":{"text":S}}, {"toggle":{"id":I}}, {"setFilter":{"filter":F}};
    F is one of showAll, showCompleted, showActive."""

    name = "todos"
    version = 1
    FILTERS = ("showAll", "showCompleted", "showActive")
    MAXIMUM_TEXT_BYTES = 1024

    @classmethod
    def initial_state(cls):
        return {"filter": "showAll", "list": {"items": [], "nextID": 1}}

    @classmethod
    def _filter(cls, value, where):
        text = _str(value, where)
        if text not in cls.FILTERS:
            raise Undecodable(f"Cannot initialize Filter from invalid String value {text} at {where}")
        return text

    @classmethod
    def _field(cls, obj, key, where):
        if key not in obj:
            raise Undecodable(f"missing key '{key}' at {where}")
        return obj[key]

    @classmethod
    def decode_action(cls, raw):
        case, payload = _case(parse_json(raw), ("add", "toggle", "setFilter"))
        if case == "add":
            return {"add": {"text": _str(cls._field(payload, "text", "add"), "add.text")}}
        if case == "toggle":
            return {"toggle": {"id": _int(cls._field(payload, "id", "toggle"), "toggle.id")}}
        return {"setFilter": {"filter": cls._filter(cls._field(payload, "filter", "setFilter"), "setFilter.filter")}}

    @classmethod
    def decode_state(cls, raw):
        value = _object(parse_json(raw), "the top level")
        lst = _object(cls._field(value, "list", "the top level"), "list")
        items = cls._field(lst, "items", "list")
        if not isinstance(items, list):
            raise Undecodable("expected an array at list.items")
        decoded = []
        for index, item in enumerate(items):
            item = _object(item, f"list.items.{index}")
            where = f"list.items.{index}"
            decoded.append(
                {
                    "completed": _bool(cls._field(item, "completed", where), where + ".completed"),
                    "id": _int(cls._field(item, "id", where), where + ".id"),
                    "text": _str(cls._field(item, "text", where), where + ".text"),
                }
            )
        return {
            "filter": cls._filter(cls._field(value, "filter", "the top level"), "filter"),
            "list": {"items": decoded, "nextID": _int(cls._field(lst, "nextID", "list"), "list.nextID")},
        }

    @staticmethod
    def _index(items, todo_id):
        # Ids are handed out in increasing order and never reused: the list is sorted by id.
        low, high = 0, len(items)
        while low < high:
            mid = (low + high) // 2
            if items[mid]["id"] < todo_id:
                low = mid + 1
            else:
                high = mid
        return low if low < len(items) and items[low]["id"] == todo_id else None

    @classmethod
    def validate(cls, action, state):
        if "add" in action:
            text = action["add"]["text"]
            if text == "":
                raise Rejection("empty_text", "todos: add needs a non-empty text")
            size = len(text.encode("utf-8"))
            if size > cls.MAXIMUM_TEXT_BYTES:
                raise Rejection(
                    "text_too_long", f"todos: add text is {size} bytes; at most {cls.MAXIMUM_TEXT_BYTES} are allowed"
                )
        elif "toggle" in action:
            todo_id = action["toggle"]["id"]
            if cls._index(state["list"]["items"], todo_id) is None:
                raise Rejection("unknown_id", f"todos: toggle names id {todo_id}, but no todo has that id")

    @classmethod
    def reduce(cls, state, action):
        lst = state["list"]
        if "add" in action:
            lst["items"].append({"completed": False, "id": lst["nextID"], "text": action["add"]["text"]})
            lst["nextID"] += 1
        elif "toggle" in action:
            index = cls._index(lst["items"], action["toggle"]["id"])
            if index is not None:
                lst["items"][index]["completed"] = not lst["items"][index]["completed"]
        else:
            state["filter"] = action["setFilter"]["filter"]


DOMAINS = {Counter.name: Counter, Todos.name: Todos}


def run(domain, actions, state=None):
    """Validates and applies JSON actions in order, as `lockstep run` does: a rejected one is skipped.
    Returns (state, seq, rejected indexes)."""
    state = domain.initial_state() if state is None else state
    seq, rejected = 0, []
    for index, raw in enumerate(actions):
        action = domain.decode_action(raw)
        try:
            domain.validate(action, state)
        except Rejection:
            rejected.append(index)
            continue
        domain.reduce(state, action)
        seq += 1
    return state, seq, rejected
