# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
SWIFT ?= swift

.PHONY: deps build demo test interop template faults bench clean

# Installs what Lockstep needs when it is missing: libzmq 4.3.3 or newer (ZeroMQ), SQLite (the journal,
# through GRDB), libfaketime (the fault suite's clock jumps) and pyzmq for Debian's python3 (the Python client).
deps:
	@pkg-config --atleast-version=4.3.3 libzmq 2>/dev/null && pkg-config --exists sqlite3 2>/dev/null \
		&& ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 && /usr/bin/python3 -c 'import zmq' 2>/dev/null || { \
		echo "make: installing libzmq3-dev, libsqlite3-dev, faketime and python3-zmq"; \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq libzmq3-dev libsqlite3-dev pkg-config faketime \
			python3 python3-zmq; \
	}

build: deps
	$(SWIFT) build

demo: build
	$$($(SWIFT) build --show-bin-path)/lockstep demo

# The unit and integration tests, the fault suite's quick mode (it mounts a tmpfs: run as root), then the template.
test: deps
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build
	$(MAKE) interop
	$$($(SWIFT) build --show-bin-path)/lockstep-faults
	$(MAKE) template

# The second implementation of the wire protocol, in Python (Tests/Interop), against a real lockstepd.
interop: deps
	Tests/Interop/run.sh "$$($(SWIFT) build --show-bin-path)"

# The tutorial's template package (docs/tutorial): its build, its tests, and its daemon and clients end to end.
template: deps
	$(SWIFT) build --package-path docs/tutorial
	$(SWIFT) test --package-path docs/tutorial
	bash docs/tutorial/smoke.sh "$$($(SWIFT) build --package-path docs/tutorial --show-bin-path)"

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

clean:
	rm -rf .build .lockstep docs/tutorial/.build
