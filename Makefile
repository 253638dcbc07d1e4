# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
SWIFT ?= swift

.PHONY: deps build demo test interop inspector template systemd faults bench docs monitoring clean

# Installs what Lockstep needs when it is missing: libzmq 4.3.3 or newer (ZeroMQ), SQLite (the journal,
# through GRDB), PostgreSQL's server and its libpq5 (the PostgreSQL journal opens libpq when used; its tests
# start a throwaway server),
# libfaketime (the fault suite's clock jumps), pyzmq for Debian's python3 (the Python client), and FUSE with
# fusepy (the power-cut filesystem, Tests/PowerCut), iproute2 (`ip netns`, `ss`: the tests' hosts), nftables
# (`nft`: the partitions between those hosts) and iptables (its NFQUEUE rule: the slow links between them).
deps:
	@pkg-config --atleast-version=4.3.3 libzmq 2>/dev/null && pkg-config --exists sqlite3 2>/dev/null \
		&& ls /usr/lib/*/libpq.so.5 /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
		&& ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 && /usr/bin/python3 -c 'import zmq, fusepy' 2>/dev/null \
		&& command -v fusermount3 >/dev/null && command -v ip >/dev/null && command -v ss >/dev/null \
		&& { command -v nft >/dev/null || [ -x /usr/sbin/nft ]; } && { command -v iptables >/dev/null || [ -x /usr/sbin/iptables ]; } \
		|| { echo "make: installing libzmq3-dev libsqlite3-dev postgresql faketime python3-zmq fuse3 python3-fusepy iproute2 nftables iptables"; \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq libzmq3-dev libsqlite3-dev libpq5 postgresql \
			pkg-config faketime python3 python3-zmq fuse3 python3-fusepy iproute2 nftables iptables; \
	}

build: deps
	$(SWIFT) build

demo: build
	$$($(SWIFT) build --show-bin-path)/lockstep demo

# The unit and integration tests, the Python client against a real lockstepd, the power-cut filesystem's own
# tests, the fault suite's quick mode (it mounts a tmpfs and the power-cut filesystem: run as root), lockstepd's
# unit under a real systemd (root; it says SKIP where systemd-nspawn cannot run, unless SYSTEMD_TEST_REQUIRED=1),
# alone and as a failover pair on PostgreSQL, then the template. lockstepd is also built in the release configuration
# (in .build-release-check, its Swift and C unoptimized to spare CI minutes — C at -O0 alone saves about a fifth of
# that build, BoringSSL being most of it: failpoints are a matter of configuration, not of optimization) for the
# test that shows a production build has none.
# At most 16 test cases at once (docs/testing.md): unbounded, a two-core machine started ~150 process tests in the
# run's first minute, and bounded waits of 20-30 s on one process there ran out.
test: deps
	$(SWIFT) build --build-tests
	$(SWIFT) build -c release -Xswiftc -Onone -Xcc -O0 --product lockstepd --scratch-path .build-release-check
	LOCKSTEP_RELEASE_LOCKSTEPD="$$($(SWIFT) build -c release --scratch-path .build-release-check --show-bin-path)/lockstepd" \
		SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH=16 $(SWIFT) test --skip-build
	$(MAKE) interop
	$(MAKE) inspector
	Tests/PowerCut/run.sh
	$$($(SWIFT) build --show-bin-path)/lockstep-faults
	bash deploy/systemd-test.sh
	bash deploy/systemd-test.sh --pair
	$(MAKE) template
	$(MAKE) monitoring

# The Grafana dashboard and Prometheus alerts in deploy/ (docs/operations.md, "Metrics"): promtool checks the rules
# and runs their unit tests (each alert fires, and stays quiet on healthy series). promtool comes with Debian's
# prometheus, installed here without its recommends (~23 MB, ~15 s) when missing, its server stopped if it started.
monitoring:
	@command -v promtool >/dev/null || { echo "make: installing prometheus (for promtool)"; \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends prometheus \
		&& { $$SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true; }; }
	bash deploy/check-monitoring.sh

# The second implementation of the wire protocol, in Python (Tests/Interop), against a real lockstepd.
interop: deps
	Tests/Interop/run.sh "$$($(SWIFT) build --show-bin-path)"

# The inspector's page (docs/operations.md, "The inspector") in a real browser: Debian's chromium, headless, driven
# by Selenium through chromium-driver, against a real lockstepd and replica (Tests/Inspector). Installs the three
# when missing (~25 s; nothing downloads a browser of its own). INSPECTOR_SCREENSHOT=docs/images/inspector.png
# saves the page as the test leaves it.
inspector: deps
	@{ [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && /usr/bin/python3 -c 'import selenium' 2>/dev/null; } \
		|| { echo "make: installing chromium chromium-driver python3-selenium"; \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver \
			python3-selenium; }
	Tests/Inspector/run.sh "$$($(SWIFT) build --show-bin-path)"

# The tutorial's template package (docs/tutorial): its build, its tests, its daemon and clients end to end, and
# boardd's unit under a real systemd (the same checks as lockstepd's, on the board store). Built in Lockstep's own
# .build (TEMPLATE_SCRATCH): the template depends on this checkout by path, so the dependencies and Lockstep's modules
# already built there serve it as they are (~1 min instead of a second cold build of them all, ~6 min);
# TEMPLATE_SCRATCH=docs/tutorial/.build builds it apart, as a copy of it would be.
TEMPLATE_SCRATCH ?= $(CURDIR)/.build
TEMPLATE = --package-path docs/tutorial --scratch-path $(TEMPLATE_SCRATCH)
BOARD_SYSTEMD_TEST = --unit docs/tutorial/deploy/boardd.service --store board \
	--setup '{"addColumn":{"name":"todo","wipLimit":1}}' --setup '{"addCard":{"title":"Write the tutorial","column":"todo"}}' \
	--action '{"renameCard":{"id":1,"title":"Ship the tutorial"}}'
template: deps
	$(SWIFT) build $(TEMPLATE)
	$(SWIFT) test $(TEMPLATE)
	bash docs/tutorial/smoke.sh "$$($(SWIFT) build $(TEMPLATE) --show-bin-path)"
	bin="$$($(SWIFT) build $(TEMPLATE) --show-bin-path)" && \
		bash deploy/systemd-test.sh $(BOARD_SYSTEMD_TEST) --daemon "$$bin/boardd" --tool "$$bin/board"

# lockstepd's unit under a real systemd: a Debian root booted with systemd-nspawn (built once into .build-nspawn/,
# a minute or two; `make clean` keeps it, rm -rf .build-nspawn builds it again), then about 20 s of checks of one
# daemon and 20-30 s of a failover pair on the root's PostgreSQL. Needs root. docs/operations.md, "### systemd" and
# "Running a failover pair under systemd", says what they prove.
systemd: build
	bash deploy/systemd-test.sh
	bash deploy/systemd-test.sh --pair

# The fault suite's long mode: 200 crash cycles, 100,000 bad inputs.
faults: build
	$$($(SWIFT) build --show-bin-path)/lockstep-faults --long

# Lockstep next to raw libzmq (and Redis Streams, installed here when apt can): a release build, under 5 min.
# Figures and keys: docs/performance.md. BENCH_FLAGS=--json for one JSON object.
bench: deps
	@command -v redis-server >/dev/null || { SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get install -y -qq redis-server >/dev/null 2>&1 \
		|| echo "make: redis-server not installed; the bench runs without the Redis comparison"; }
	$(SWIFT) build -c release
	$$($(SWIFT) build -c release --show-bin-path)/lockstep bench $(BENCH_FLAGS)

# The API reference of every library target (DocC, swift-docc-plugin), one archive per target in
# .build/plugins/Swift-DocC/outputs; a warning (a broken symbol link, say) fails it. Not part of `make test`.
# SWIFTPM_FLAGS="--scratch-path .build-docs" builds elsewhere than .build.
DOC_TARGETS = Lockstep LockstepProtocol LockstepJournal LockstepServer LockstepClient LockstepTesting \
	LockstepExamples LockstepTool ZeroMQ
docs: deps
	$(SWIFT) package $(SWIFTPM_FLAGS) generate-documentation $(addprefix --target ,$(DOC_TARGETS)) --warnings-as-errors

clean:
	rm -rf .build .build-release-check .lockstep docs/tutorial/.build
