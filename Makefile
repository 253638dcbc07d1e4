# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
SWIFT ?= swift

.PHONY: deps build demo test clean

# Installs libzmq (the one system library Lockstep needs) when pkg-config cannot find 4.3.3 or newer.
deps:
	@pkg-config --atleast-version=4.3.3 libzmq 2>/dev/null || { \
		echo "make: installing libzmq3-dev (libzmq 4.3.3 or newer is required)"; \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq libzmq3-dev pkg-config; \
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
