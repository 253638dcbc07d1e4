"""The inspector's page in a real browser: Debian's chromium, headless, driven by Selenium through chromium-driver.

A real lockstepd (its HTTP listener on a free loopback port), a real replica process (`lockstep demo-client`, which
reports its progress), and dispatches made by the `lockstep` tool, another process. The page must show a dispatch
within a second, a rejection as rejected, the state at an earlier seq with its diff, and a SIGSTOPped replica's lag.

Run by Tests/Inspector/run.sh (`make inspector`, part of `make test`). With INSPECTOR_SCREENSHOT=PATH it saves the
page, as it stands once all of that has shown, to PATH (docs/images/inspector.png is one).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
INTEROP = os.path.join(os.path.dirname(HERE), "Interop")
if INTEROP not in sys.path:
    sys.path.insert(0, INTEROP)

import zmq  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

import lockstep_wire as wire  # noqa: E402
from harness import Daemon, TempRoot, binary, spawn  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")


class InspectorInABrowser(unittest.TestCase):
    def setUp(self):
        self.root = TempRoot()
        self.addCleanup(self.root.cleanup)
        self.daemon = Daemon(self.root.path, http={"listen": '"127.0.0.1:0"'})
        self.daemon.start()
        self.addCleanup(self.daemon.stop)
        self.address = self.daemon.status()["http"]
        self.assertTrue(self.address.startswith("127.0.0.1:"), self.address)
        # A replica of todos in its own process, reporting once a second.
        self.replica_log = open(os.path.join(self.root.path, "replica.log"), "w")
        self.addCleanup(self.replica_log.close)
        self.replica = spawn(
            [
                binary("lockstep"), "demo-client", "--stores", "todos", "--actions", "0", "--report-ms", "1000",
                "--command-endpoint", self.daemon.command, "--events-endpoint", self.daemon.events,
            ],
            stdout=self.replica_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        self.addCleanup(self.stop_replica)
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1440,1200"):
            options.add_argument(argument)
        self.browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.addCleanup(self.browser.quit)

    def stop_replica(self):
        if self.replica.poll() is None:
            self.replica.send_signal(signal.SIGCONT)
            self.replica.terminate()
            try:
                self.replica.wait(10)
            except subprocess.TimeoutExpired:
                self.replica.kill()
                self.replica.wait(5)

    # -- helpers --

    def until(self, what: str, condition, timeout: float):
        """Waits, bounded, for `condition(browser)` to be truthy; fails naming `what` and the page's log otherwise."""
        try:
            # The page redraws its tables once a second: an element read as it is replaced is read again.
            return WebDriverWait(
                self.browser, timeout, poll_frequency=0.02,
                ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
            ).until(lambda browser: condition(browser))
        except Exception as error:  # selenium's TimeoutException, or what the condition raised last
            raise AssertionError(f"{what} did not happen within {timeout} s ({type(error).__name__}); "
                                 f"daemon log: {self.daemon.log_tail()}") from None

    def rows(self, selector: str):
        return self.browser.find_elements(By.CSS_SELECTOR, selector)

    def dispatch(self, store: str, action: str) -> int:
        """Dispatches one action with the Swift tool (another process); returns its seq."""
        result = self.daemon.lockstep("dispatch", store, action, "--json")
        return json.loads(result.stdout.splitlines()[-1])["seq"]

    def replica_row(self, browser):
        """The row of the todos replica (the demo-client), when the table has one."""
        rows = browser.find_elements(By.CSS_SELECTOR, "#replicas tbody tr")
        return next((row for row in rows if row.find_elements(By.TAG_NAME, "td")[0].text == "todos"), None)

    # -- the page --

    def test_the_page_shows_dispatches_rejections_earlier_states_and_a_stopped_replicas_lag(self):
        self.browser.get(f"http://{self.address}/")
        self.assertEqual(self.browser.title, "Lockstep inspector")
        self.until("the live stream", lambda b: b.find_element(By.ID, "live-text").text == "live", 10)
        self.until("the stores table", lambda b: b.find_elements(By.ID, "store-todos"), 5)

        # A dispatch made by another process shows in the log within a second of its acknowledgement.
        for text in ("Write the inspector", "Test it in chromium", "Take a screenshot"):
            seq = self.dispatch("todos", json.dumps({"add": {"text": text}}))
            acknowledged = time.monotonic()
            self.until(f"seq {seq} in the log",
                       lambda b: self.rows(f'#log tr.committed[data-store="todos"][data-seq="{seq}"]'), 1.0)
            self.assertLess(time.monotonic() - acknowledged, 1.0)
        row = self.rows('#log tr[data-store="todos"][data-seq="2"]')[0]
        self.assertIn("Test it in chromium", row.text)
        self.assertIn("committed", row.text)
        for store, action in (("counter", {"increment": {}}), ("counter", {"increment": {}}),
                              ("numbers", {"add": {"number": 42}}), ("posts", {"setPosts": {"posts": ["Hello"]}})):
            self.dispatch(store, json.dumps(action))

        # A rejected action shows as rejected, with its code, within a second.
        rejected = self.daemon.lockstep("dispatch", "todos", '{"toggle":{"id":99}}', check=False)
        self.assertEqual(rejected.returncode, 3, rejected.stderr)
        answered = time.monotonic()
        self.until("the rejection in the log", lambda b: self.rows("#log tr.rejected"), 1.0)
        self.assertLess(time.monotonic() - answered, 1.0)
        rejection = self.rows("#log tr.rejected")[0].text
        self.assertIn("unknown_id", rejection)
        self.assertIn('"toggle"', rejection)

        # A replica's report of a divergence shows as it happens (a REPORT on the wire, as docs/protocol.md has it:
        # first its arrival, then its count of divergences up by one).
        epoch = int(self.daemon.store_status("counter")["epoch"], 16)
        reporter = zmq.Context.instance().socket(zmq.DEALER)
        reporter.setsockopt(zmq.LINGER, 0)
        reporter.connect(self.daemon.command)
        self.addCleanup(reporter.close)
        for divergences, shown in ((0, "python-replica of counter reports"), (1, "python-replica of counter diverged")):
            report = wire.Report(0, bytes(range(16)), "counter", "python-replica", epoch, 2, 1000,
                                 divergences=divergences)
            reporter.send_multipart([b""] + wire.encode_request(report))
            self.until(f"'{shown}' in the happenings",
                       lambda b: shown in b.find_element(By.ID, "happenings").text, 5)

        # Choosing an earlier seq shows that state, and the diff from the seq before it.
        self.browser.find_element(By.CSS_SELECTOR, '#log tr[data-store="todos"][data-seq="2"]').click()
        tree = self.until("the state at seq 2",
                          lambda b: b.find_element(By.ID, "state-tree") if
                          b.find_element(By.ID, "state-tree").get_attribute("data-seq") == "2" else None, 5)
        self.assertIn("Test it in chromium", tree.text)
        self.assertNotIn("Take a screenshot", tree.text)
        diff = self.browser.find_element(By.ID, "diff")
        self.assertIn("2 changes", self.browser.find_element(By.ID, "diff-title").text)
        self.assertIn("+ list.items[1]", diff.text)
        self.assertIn("~ list.nextID: 2 → 3", diff.text)
        self.assertIn("Test it in chromium", diff.text)
        self.assertIn("Actions 2…2", self.browser.find_element(By.ID, "between-title").text)
        # Typed in: seq 0 against seq 3 (three todos added, the next id moved on).
        Select(self.browser.find_element(By.ID, "state-store")).select_by_value("todos")
        for field, value in (("state-seq", "3"), ("state-compare", "0")):
            box = self.browser.find_element(By.ID, field)
            box.clear()
            box.send_keys(value)
        self.browser.find_element(By.ID, "state-show").click()
        self.until("the diff from 0 to 3", lambda b: "4 changes" in b.find_element(By.ID, "diff-title").text, 5)
        self.assertIn("Take a screenshot", self.browser.find_element(By.ID, "state-tree").text)

        # The replica reports itself caught up; SIGSTOPped, its lag rises and it is flagged; SIGCONTed, it falls.
        self.until("the replica caught up", lambda b: (row := self.replica_row(b)) is not None
                   and row.find_element(By.CLASS_NAME, "lag-events").text == "0", 15)
        self.replica.send_signal(signal.SIGSTOP)
        for index in range(20):
            self.dispatch("todos", json.dumps({"add": {"text": f"while the replica sleeps {index}"}}))
        self.until("the stopped replica's lag", lambda b: (row := self.replica_row(b)) is not None
                   and int(row.find_element(By.CLASS_NAME, "lag-events").text) >= 20
                   and "lagging" in row.get_attribute("class"), 15)
        screenshot = os.environ.get("INSPECTOR_SCREENSHOT")
        if screenshot:
            self.browser.find_element(By.CSS_SELECTOR, '#log tr[data-store="todos"][data-seq="2"]').click()
            self.until("the state at seq 2 again",
                       lambda b: b.find_element(By.ID, "state-tree").get_attribute("data-seq") == "2", 5)
            self.assertTrue(self.browser.save_screenshot(screenshot), f"could not save {screenshot}")
        self.replica.send_signal(signal.SIGCONT)
        self.until("the resumed replica caught up", lambda b: (row := self.replica_row(b)) is not None
                   and row.find_element(By.CLASS_NAME, "lag-events").text == "0"
                   and "lagging" not in row.get_attribute("class"), 15)


if __name__ == "__main__":
    unittest.main()
