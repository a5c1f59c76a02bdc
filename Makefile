# smclo - top-level entry points.  CMake does the building; this file only
# gives the commands the README promises.
#
#   make          build everything into build/
#   make demo     build, then run `smclo bench` (TCP loopback vs smclo)
#   make test     build, install test dependencies if missing, run every test;
#                 also compile a Release (-O3) build: some warnings (-Werror)
#                 only show at -O3; then the static analysis (make lint), the
#                 pytest suite once more against an AddressSanitizer +
#                 UndefinedBehaviorSanitizer build (make sanitize) and a
#                 30-second run of every fuzzer
#   make lint     cppcheck and gcc -fanalyzer over src/ (tools/lint.sh)
#   make sanitize the tests against ASan+UBSan and ThreadSanitizer builds
#   make fuzz     every libFuzzer harness for 10 minutes (tests/fuzz/run.sh)
#   make bench    the benchmark suite against real programs (writes BENCHMARKS.md),
#                 then the native API rows (bench/api.py: bench/api-results.md)
#   make soak     a million connections through one server, 20 clients killed
#                 with SIGKILL meanwhile: nothing may be left behind
#   make install  the command, library, man page and smclo.pc under PREFIX
#                 (default /usr/local), staged under DESTDIR if given
#   make uninstall  removes exactly what make install put there (same PREFIX,
#                 DESTDIR): the list it wrote in PREFIX/share/smclo
#   make deb      smclo_<version>_<arch>.deb (packaging/deb.sh), checked by lintian

BUILD ?= build
PYTHON ?= python3
PREFIX ?= /usr/local
DESTDIR ?=
DEB_DIR ?= .
# what make install put under PREFIX, one path a line (without DESTDIR)
MANIFEST = $(DESTDIR)$(PREFIX)/share/smclo/installed-files
TEST_DEBS = redis-server redis-tools nginx-light wrk iperf3 sockperf curl socat postgresql \
            python3-pytest liburing-dev iproute2 util-linux cmake ninja-build gcc strace \
            clang cppcheck python3-prometheus-client dpkg-dev lintian fakeroot \
            openbsd-inetd busybox-static \
            memcached mosquitto mosquitto-clients systemd pgbouncer apache2 apache2-utils \
            php-fpm varnish openssh-server openssh-client rsync git libseccomp-dev \
            mariadb-server mariadb-client \
            podman runc catatonit netavark iptables mmdebstrap

.PHONY: all build release demo test unit pytest deps clean bench soak lint sanitize fuzz fuzz-smoke \
        install uninstall deb

all: build

build:
	@command -v cmake >/dev/null && command -v ninja >/dev/null || $(MAKE) --no-print-directory deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD)

release:
	cmake -S . -B $(BUILD)-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD)-release

demo: build
	$(BUILD)/smclo bench

# Install from the build tree as it is (built first if it is not): nothing is
# configured again, so `sudo make install` after `make` compiles nothing; the
# prefix is given to the install step alone (the command finds its library
# relative to itself, smclo.pc is written for this prefix).  The list of
# files installed is kept in the installed tree, so make uninstall needs
# only the same PREFIX and DESTDIR, not this build tree.
install:
	@[ -f $(BUILD)/CMakeCache.txt ] || $(MAKE) --no-print-directory build
	cmake --build $(BUILD)
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"
	@mkdir -p "$(dir $(MANIFEST))"
	@{ cat $(BUILD)/install_manifest.txt; echo; echo "$(PREFIX)/share/smclo/installed-files"; } \
		| sed '/^$$/d' > "$(MANIFEST)"
	@echo "installed $$(wc -l < "$(MANIFEST)") files under $(DESTDIR)$(PREFIX); list: $(MANIFEST)"
	@# the shared registry now, as tmpfiles.d makes it at boot: smclo run by root makes it
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && "$(PREFIX)/bin/smclo" stats >/dev/null; \
		then echo "shared registry: /dev/shm/smclo"; fi

uninstall:
	@[ -f "$(MANIFEST)" ] || { echo "make uninstall: no $(MANIFEST): nothing installed" \
		"there by make install (give the PREFIX and DESTDIR it was given)" >&2; exit 1; }
	@while IFS= read -r f; do rm -f -- "$(DESTDIR)$$f" && echo "removed $(DESTDIR)$$f"; \
		done < "$(MANIFEST)"
	@rmdir "$(DESTDIR)$(PREFIX)/share/smclo"

deb:
	sh packaging/deb.sh $(BUILD)-deb $(DEB_DIR)

# Install only what is missing; apt-get update only when something is.
deps:
	@missing=""; for p in $(TEST_DEBS); do \
		dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

unit: build
	cd $(BUILD) && ctest --output-on-failure

pytest: build
	cd tests/py && SMCLO_BUILD=$(abspath $(BUILD)) $(PYTHON) -m pytest -q -p no:cacheprovider

test: deps
	@$(MAKE) --no-print-directory build
	@$(MAKE) --no-print-directory release
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory pytest
	@$(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory sanitize
	@$(MAKE) --no-print-directory fuzz-smoke

lint:
	bash tools/lint.sh

sanitize: deps
	PYTHON=$(PYTHON) sh tools/sanitize.sh
	PYTHON=$(PYTHON) sh tools/sanitize.sh --tsan

fuzz:
	bash tests/fuzz/run.sh 600

fuzz-smoke:
	bash tests/fuzz/run.sh 30

soak: deps build
	cd tests/py && SMCLO_BUILD=$(abspath $(BUILD)) SMCLO_CHURN=1000000 SMCLO_CHURN_KILLS=20 \
		$(PYTHON) -m pytest -q -p no:cacheprovider test_churn.py

bench: deps build
	@dpkg -s python3-matplotlib >/dev/null 2>&1 || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq python3-matplotlib >/dev/null; }
	/usr/bin/python3 bench/run.py
	/usr/bin/python3 bench/api.py

clean:
	rm -rf $(BUILD) $(BUILD)-release $(BUILD)-deb build-asan build-tsan build-fuzz
