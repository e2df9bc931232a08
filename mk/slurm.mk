# Slurm lab dependencies (Debian 12 packages) for the Slurm bridge tests.
# Included by the main Makefile. Needs root. Idempotent: installs nothing when the
# packages are present and creates the lab's system users only when missing.

SLURM_PACKAGES := slurmctld slurmd slurmrestd slurm-client munge slurm-wlm-jwt-plugin
# slurmrest runs slurmrestd (it refuses root and SlurmUser); dispatch owns the jobs (JWT user).
SLURM_USERS := slurmrest dispatch

.PHONY: slurm-deps
slurm-deps:
	@missing=""; \
	for p in $(SLURM_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "slurm-deps: installing$$missing"; \
	  if ! apt-get install -y --no-install-recommends --dry-run $$missing >/dev/null 2>&1; then \
	    apt-get update; \
	  fi; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	else \
	  echo "slurm-deps: packages already installed"; \
	fi
	@for u in $(SLURM_USERS); do \
	  id -u $$u >/dev/null 2>&1 || useradd -r -M -s /usr/sbin/nologin $$u; \
	done

# Slurm 24.11 (Debian 13) and 26.05 (Debian unstable) for the live tests: each a debootstrap chroot,
# built once (both in parallel) and cached outside the repo, keyed by suite.
SLURM_CHROOT_SUITES := trixie sid
SLURM_CHROOT_CACHE ?= $(or $(DISPATCH_CHROOT_CACHE),$(HOME)/.cache/dispatch/chroot)

.PHONY: slurm-chroots
slurm-chroots: ## Slurm 24.11 and 26.05 chroots (built in parallel, cached)
	@pids=""; for s in $(SLURM_CHROOT_SUITES); do \
	  bash hack/slurm-chroot.sh $$s $(SLURM_CHROOT_CACHE) & pids="$$pids $$!"; \
	done; rc=0; for p in $$pids; do wait $$p || rc=1; done; exit $$rc

.PHONY: slurm-record
slurm-record: $(STAMP) slurm-deps slurm-chroots ## re-record slurmrestd's answers for the unit tests (all three Slurms)
	$(PY) hack/slurm-record.py
