#!/usr/bin/env bash
# Checks the monitoring in deploy/: the Prometheus alerting rules (promtool check rules), their unit tests
# (promtool test rules: each alert fires on series that should trigger it and stays quiet on healthy ones), and the
# Grafana dashboard (valid JSON, and every metric its PromQL names is one lockstepd or a replica serves, as
# docs/operations.md, "Metrics", lists them, or `up`). The alerts' expressions get the same metric check.
# Needs promtool (Debian: apt-get install --no-install-recommends prometheus; `make monitoring` does it) and python3.
#
#   bash deploy/check-monitoring.sh      # or: make monitoring
set -euo pipefail
cd "$(dirname "$0")/.."

rules=deploy/prometheus/lockstep-alerts.yml
tests=deploy/prometheus/lockstep-alerts.test.yml
dashboard=deploy/grafana/lockstep-dashboard.json

if ! command -v promtool >/dev/null 2>&1; then
    echo "check-monitoring: FAILED: promtool not found on PATH." >&2
    echo "check-monitoring: install Debian's prometheus package (it ships /usr/bin/promtool): run \`make monitoring\`," >&2
    echo "check-monitoring: or apt-get install --no-install-recommends prometheus" >&2
    exit 1
fi
command -v python3 >/dev/null 2>&1 || { echo "check-monitoring: FAILED: python3 not found on PATH" >&2; exit 1; }

echo "check-monitoring: $(promtool --version 2>&1 | head -n1)"
promtool check rules "$rules"
promtool test rules "$tests"

python3 - "$dashboard" "$rules" <<'PY'
import json, re, sys

# What lockstepd serves (docs/operations.md, "Metrics"), and a replica process's own metrics.
KNOWN = {
    "lockstep_actions_accepted_total", "lockstep_actions_rejected_total", "lockstep_dispatches_refused_total",
    "lockstep_errors_total", "lockstep_journal_bytes", "lockstep_snapshots_total", "lockstep_subscriptions",
    "lockstep_leader", "lockstep_lease_term", "lockstep_takeovers_total", "lockstep_store_seq",
    "lockstep_effects_pending", "lockstep_effects_dead", "lockstep_replicas", "lockstep_replica_lag_events",
    "lockstep_replica_lag_seconds", "lockstep_replica_repairs_total", "lockstep_replica_resyncs_total",
    "lockstep_replica_divergences_total",
    "lockstep_client_applied_seq", "lockstep_client_lag_events", "lockstep_client_repairs_total",
    "lockstep_client_resyncs_total", "lockstep_client_divergences_total",
    "up",
}
HISTOGRAMS = {"lockstep_commit_batch_actions", "lockstep_journal_commit_seconds", "lockstep_journal_fsync_seconds"}
KNOWN |= {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
            "offset", "inf", "nan"}

def metric_names(expr):
    """The metric names a PromQL expression (with Grafana's $variables) selects."""
    e = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)   # string literals
    e = re.sub(r"\{[^{}]*\}", " ", e)                          # label matchers
    e = re.sub(r"\[[^\[\]]*\]", " ", e)                        # range and subquery selectors
    e = re.sub(r"\$\{[^}]*\}|\$\w+", " ", e)                   # Grafana variables
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", e)  # label lists
    e = re.sub(r"\boffset\s+-?\w+", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names

def label_values_metric(query):
    m = re.match(r"\s*label_values\(\s*([^,()]+?)\s*,", query)
    return m.group(1) if m else None

problems, exprs = [], []
path, rules_path = sys.argv[1], sys.argv[2]
try:
    with open(path) as f:
        dash = json.load(f)
except (OSError, json.JSONDecodeError) as error:
    sys.exit(f"check-monitoring: FAILED: {path} is not valid JSON: {error}")

def walk(panels):
    for panel in panels:
        yield panel
        yield from walk(panel.get("panels", []))

ids = [p.get("id") for p in walk(dash.get("panels", []))]
if len(ids) != len(set(ids)):
    problems.append(f"panel ids repeat: {sorted(i for i in set(ids) if ids.count(i) > 1)}")
for panel in walk(dash.get("panels", [])):
    for target in panel.get("targets", []):
        if "expr" in target:
            exprs.append((f'panel "{panel.get("title")}" {target.get("refId")}', target["expr"]))
for var in dash.get("templating", {}).get("list", []):
    if var.get("type") == "query":
        query = var.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        inner = label_values_metric(query)
        exprs.append((f'variable ${var.get("name")}', inner if inner is not None else query))
names_used = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
for needed in ("DS_PROMETHEUS", "store", "instance"):
    if needed not in names_used:
        problems.append(f"no template variable {needed}")
if not any(where.startswith("panel") for where, _ in exprs):
    problems.append("no panel has a PromQL expression")

# The rules file: `expr:` lines (one line each, as written there).
with open(rules_path) as f:
    for number, line in enumerate(f, 1):
        m = re.match(r"\s*expr:\s*(.+?)\s*$", line)
        if m:
            if m.group(1) in ("|", ">", "|-", ">-"):
                problems.append(f"{rules_path}:{number}: write expr on one line (this check reads it so)")
            exprs.append((f"{rules_path}:{number}", m.group(1).strip("'\"")))

checked = set()
for where, expr in exprs:
    names = metric_names(expr)
    if not names and "label_values" not in expr:
        problems.append(f"{where}: no metric name found in: {expr}")
    for name in sorted(names):
        checked.add(name)
        if name not in KNOWN:
            problems.append(f"{where}: unknown metric {name} in: {expr}")

if problems:
    print(f"check-monitoring: FAILED: {len(problems)} problem(s):", file=sys.stderr)
    for p in problems:
        print(f"  {p}", file=sys.stderr)
    sys.exit(1)
print(f"check-monitoring: {path}: valid JSON, {len(ids)} panels, {len(exprs)} expressions "
      f"(with {rules_path}'s), {len(checked)} metric names, all known")
PY
echo "check-monitoring: passed"
