#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs perfbuf's selftests inside Docker (what `make docker-test` calls).
#
#   scripts/docker-test.sh               on the host: engine, base image, build, run
#   scripts/docker-test.sh in-container  inside the image (its default CMD): mount bpffs and
#                                        tracefs, then `make $TEST_TARGET`
#
# Host-side settings (environment or `make docker-test VAR=...`):
#   DOCKER_RUN_FLAGS    privileges for `docker run` (default --privileged). When the default
#                       fails with "unable to apply caps" (a host whose capability bounding
#                       set lacks a capability, e.g. CAP_SYS_RESOURCE), the run is retried
#                       with $DOCKER_FALLBACK_FLAGS and a note saying so.
#   DOCKER_FALLBACK_FLAGS  default: --cap-add ALL --cap-drop SYS_RESOURCE
#                       --security-opt seccomp=unconfined --security-opt apparmor=unconfined
#   DOCKER_BUILD_FLAGS  extra `docker build` flags (e.g. --no-cache)
#   BASE_IMAGE          image to build FROM (default debian:bookworm; when missing locally it
#                       is made with debootstrap by scripts/docker-engine.sh, no registry needed)
#   PERFBUF_IMAGE       tag of the built image (default perfbuf-build)
#   BUILD_TARGET        make target run by the image build (default: the Dockerfile's, build)
#   TEST_TARGET         make target run in the container (default selftest)
#   PERFBUF_HOST_CA     host CA bundle to trust inside the build (default: the system bundle;
#                       set it empty to skip)
#   PERFBUF_START_ENGINE  1 (default): start a Docker engine if none answers; 0: fail instead
#   CI                  passed through into the container
set -euo pipefail

log() { echo "docker-test: $*" >&2; }

# ---------------------------------------------------------------- inside the container
in_container() {
	local target=${TEST_TARGET:-selftest}
	# bpffs: pinned maps/programs. tracefs: tracepoint attachment and ids. Both are mounted
	# in the container's own mount namespace, so the host's mounts are untouched.
	mount_fs() { # TYPE DIR
		if mountpoint -q "$2"; then return 0; fi
		mkdir -p "$2" 2>/dev/null || true
		if mount -t "$1" "$1" "$2" 2>/dev/null; then
			log "mounted $1 on $2"
		else
			log "warning: could not mount $1 on $2 (missing privileges?); tests that need it will fail"
		fi
	}
	mount_fs bpf /sys/fs/bpf
	mount_fs tracefs /sys/kernel/tracing
	if [ ! -r /sys/kernel/btf/vmlinux ]; then
		log "warning: /sys/kernel/btf/vmlinux is not readable: the kernel has no BTF, or it was not bound in"
	fi
	log "running 'make $target' as $(id -un) (CI=${CI:-unset}, kernel $(uname -r))"
	exec make "$target"
}

# ---------------------------------------------------------------- on the host
# fail STEP MESSAGE: name the step that broke, then exit non-zero.
fail() {
	end_step
	print_timings
	log "FAILED at step '$1': $2"
	exit 1
}

# step NAME: announce a step and remember when it started (for the timing summary).
step_name=
step_start=0
timings=()
step() {
	end_step
	step_name=$1
	step_start=$SECONDS
	log "== $step_name"
}
end_step() {
	if [ -n "$step_name" ]; then
		timings+=("$step_name $((SECONDS - step_start))s")
		step_name=
	fi
}

print_timings() {
	local t summary=
	for t in "${timings[@]}"; do summary+="${summary:+, }$t"; done
	[ -z "$summary" ] || log "step times: $summary"
}

host() {
	local repo script_dir
	script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
	repo=$(cd "$script_dir/.." && pwd)
	cd "$repo"

	local image=${PERFBUF_IMAGE:-perfbuf-build}
	local base=${BASE_IMAGE:-debian:bookworm}
	local target=${TEST_TARGET:-selftest}
	local fallback=${DOCKER_FALLBACK_FLAGS:---cap-add ALL --cap-drop SYS_RESOURCE --security-opt seccomp=unconfined --security-opt apparmor=unconfined}
	local user_flags=${DOCKER_RUN_FLAGS-}
	# Word splitting is wanted for the flag strings: they hold several options.
	local -a run_flags build_flags
	read -r -a run_flags <<<"${user_flags:---privileged}"
	read -r -a build_flags <<<"${DOCKER_BUILD_FLAGS-}"

	# 1. engine ---------------------------------------------------------------
	step engine
	if ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
		[ "${PERFBUF_START_ENGINE:-1}" = 1 ] ||
			fail engine "no Docker engine answers and PERFBUF_START_ENGINE=0"
		"$script_dir/docker-engine.sh" start || fail engine "could not start a Docker engine (scripts/docker-engine.sh start)"
	fi
	log "engine $(docker version --format '{{.Server.Version}}')"

	# 2. base image -------------------------------------------------------------
	step base-image
	if docker image inspect "$base" >/dev/null 2>&1; then
		log "$base present"
	elif [[ $base == debian:* ]] && command -v apt-get >/dev/null 2>&1; then
		# No registry needed: debootstrap the suite named by the tag from the host's mirror.
		PERFBUF_BASE_IMAGE=$base PERFBUF_SUITE=${base#debian:} "$script_dir/docker-engine.sh" base-image ||
			fail base-image "could not make $base with debootstrap (scripts/docker-engine.sh base-image)"
	else
		log "$base not present locally; docker build will try to pull it"
	fi

	# 3. build ------------------------------------------------------------------
	step build
	# Stage the host's CA bundle (see Dockerfile.build). Only rewritten when it changed, so
	# the image layer that installs it stays cached.
	local ca=${PERFBUF_HOST_CA-}
	if [ -z "${PERFBUF_HOST_CA+set}" ]; then
		for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do
			if [ -s "$f" ]; then ca=$f; break; fi
		done
	fi
	if [ -n "$ca" ]; then
		mkdir -p build/docker
		cmp -s "$ca" build/docker/host-ca.crt || cp "$ca" build/docker/host-ca.crt
	else
		rm -f build/docker/host-ca.crt
	fi
	local -a args=(--network host --force-rm -f Dockerfile.build --build-arg "BASE_IMAGE=$base" -t "$image")
	[ -n "${BUILD_TARGET-}" ] && args+=(--build-arg "BUILD_TARGET=$BUILD_TARGET")
	log "docker build ${args[*]} ${build_flags[*]} ."
	docker build "${args[@]}" "${build_flags[@]}" . ||
		fail build "docker build of $image failed (output above)"

	# 4. run ----------------------------------------------------------------------
	step run
	# A throwaway container first: tells a privilege problem (the engine cannot even create
	# the container) apart from a test failure, and picks the flags that work on this host.
	local probe_err
	if ! probe_err=$(docker run --rm "${run_flags[@]}" --entrypoint true "$image" 2>&1); then
		if grep -q 'unable to apply caps' <<<"$probe_err" && [ -z "$user_flags" ]; then
			log "note: 'docker run --privileged' failed here with \"unable to apply caps\":"
			log "      the host's capability bounding set lacks some capability (typically"
			log "      CAP_SYS_RESOURCE in a nested container/VM). Retrying with:"
			log "      $fallback"
			log "      (set DOCKER_RUN_FLAGS to choose the flags yourself)"
			read -r -a run_flags <<<"$fallback"
			probe_err=$(docker run --rm "${run_flags[@]}" --entrypoint true "$image" 2>&1) ||
				fail run "cannot start a container with the fallback flags either: $probe_err"
		elif grep -q 'unable to apply caps' <<<"$probe_err"; then
			fail run "cannot start a container with DOCKER_RUN_FLAGS='$user_flags': $probe_err
  (this host lacks a capability; try DOCKER_RUN_FLAGS='$fallback')"
		else
			fail run "cannot start a container with flags '${run_flags[*]}': $probe_err"
		fi
	fi

	# No --pid=host: the container keeps a PID namespace of its own, as a user's
	# would, and execsnoop prints PIDs as that namespace numbers them.
	local -a mounts=()
	# BTF for CO-RE relocation and tp_btf/fentry; read-only, it is the host kernel's.
	[ -d /sys/kernel/btf ] && mounts+=(-v /sys/kernel/btf:/sys/kernel/btf:ro)
	local -a envs=(-e "TEST_TARGET=$target")
	[ -n "${CI+set}" ] && envs+=(-e "CI=$CI")

	log "docker run --rm ${run_flags[*]} ${mounts[*]} ${envs[*]} $image"
	local rc=0
	docker run --rm "${run_flags[@]}" "${mounts[@]}" "${envs[@]}" "$image" || rc=$?
	end_step
	case $rc in
	0)
		print_timings
		log "OK: 'make $target' passed in $image"
		;;
	125 | 126 | 127) fail run "docker could not run the container (exit $rc)" ;;
	*) fail run "'make $target' failed inside the container (exit $rc); the test summary is above" ;;
	esac
}

case "${1:-}" in
in-container) in_container ;;
"" | run) host ;;
*)
	echo "usage: $0 [run|in-container]" >&2
	exit 2
	;;
esac
