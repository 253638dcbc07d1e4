# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
SWIFT ?= swift

.PHONY: deps build demo test clean

# Installs the system libraries Lockstep links when pkg-config cannot find them: libzmq 4.3.3 or newer
# (ZeroMQ) and SQLite (the journal, through GRDB).
deps:
	@pkg-config --atleast-version=4.3.3 libzmq 2>/dev/null && pkg-config --exists sqlite3 2>/dev/null || { \
		echo "make: installing libzmq3-dev and libsqlite3-dev"; \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq libzmq3-dev libsqlite3-dev pkg-config; \
	}

build: deps
	$(SWIFT) build

demo: build
	$$($(SWIFT) build --show-bin-path)/lockstep demo

test: deps
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build

clean:
	rm -rf .build .lockstep
