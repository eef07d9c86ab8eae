#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Manages the local Docker engine that `make docker-test` needs, on a Debian host.
#
#   scripts/docker-engine.sh start       install docker.io if dockerd is missing, start dockerd
#                                        in the background unless an engine already answers,
#                                        and wait (bounded) until it accepts requests
#   scripts/docker-engine.sh stop        stop the dockerd that `start` launched; an engine
#                                        started by someone else is left alone
#   scripts/docker-engine.sh base-image  make sure $PERFBUF_BASE_IMAGE exists locally; when it
#                                        does not (and no registry can be reached), build it
#                                        with debootstrap and `docker import`
#   scripts/docker-engine.sh status      say whether an engine answers and who started it
#
# Environment (all optional):
#   PERFBUF_CACHE        state and cache directory            (default /var/cache/perfbuf)
#   PERFBUF_BASE_IMAGE   image name the base is imported as    (default debian:bookworm)
#   PERFBUF_SUITE        Debian suite for debootstrap          (default bookworm)
#   PERFBUF_MIRROR       Debian mirror for debootstrap         (default: the host's apt mirror)
#   DOCKERD_TIMEOUT      seconds to wait for dockerd to answer (default 60)
#
# Needs root for `start`, `stop` and the debootstrap part of `base-image`.
set -euo pipefail

CACHE=${PERFBUF_CACHE:-/var/cache/perfbuf}
BASE_IMAGE=${PERFBUF_BASE_IMAGE:-debian:bookworm}
SUITE=${PERFBUF_SUITE:-bookworm}
TIMEOUT=${DOCKERD_TIMEOUT:-60}
SOCK=/var/run/docker.sock
PIDFILE=$CACHE/dockerd.pid   # present only while a dockerd we started is (believed) running
LOGFILE=$CACHE/dockerd.log

log() { echo "docker-engine: $*" >&2; }
die() { log "error: $*"; exit 1; }

need_root() {
	[ "$(id -u)" -eq 0 ] || die "'$1' needs root (run it with sudo)"
}

# True when a Docker engine answers on the default socket (or $DOCKER_HOST).
engine_up() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

# The pid recorded in $PIDFILE, if that process is still a running dockerd.
our_dockerd_pid() {
	local pid
	[ -f "$PIDFILE" ] || return 1
	pid=$(cat "$PIDFILE")
	[ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] || return 1
	echo "$pid"
}

# apt-get install, refreshing the package lists once per invocation.
apt_updated=
apt_install() {
	export DEBIAN_FRONTEND=noninteractive
	if [ -z "$apt_updated" ]; then
		apt-get update -qq
		apt_updated=1
	fi
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# The Debian mirror the host already uses (deb822 first, then one-line format).
host_mirror() {
	local m
	# `|| true`: under pipefail a missing file would otherwise end the script here.
	m=$(grep -hs '^URIs:' /etc/apt/sources.list.d/debian.sources | head -n1 | awk '{print $2}' || true)
	if [ -z "$m" ]; then
		m=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -m1 debian || true)
	fi
	echo "${m:-http://deb.debian.org/debian}"
}

# write_sources ROOTFS MIRROR: /etc/apt/sources.list.d/debian.sources for $SUITE, as the
# official image has it. The security archive is the host's if it names one, else the
# mirror's sibling ".../debian-security".
write_sources() {
	local root=$1 mirror=$2 security
	security=$(grep -hs '^URIs:.*debian-security' /etc/apt/sources.list.d/debian.sources | head -n1 | awk '{print $2}' || true)
	: "${security:=${mirror%/debian}/debian-security}"
	rm -f "$root/etc/apt/sources.list"
	cat >"$root/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $mirror
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
}

cmd_start() {
	if engine_up; then
		if pid=$(our_dockerd_pid); then
			log "dockerd already running (pid $pid, started by this script)"
		else
			log "a Docker engine is already running (not started by this script; leaving it alone)"
		fi
		return 0
	fi
	need_root start
	mkdir -p "$CACHE"

	# The client may already exist without an engine (as on our CI hosts): only dockerd matters.
	if ! command -v dockerd >/dev/null 2>&1; then
		log "dockerd not found; installing Debian's docker.io"
		apt_install docker.io
	fi
	command -v docker >/dev/null 2>&1 || die "docker client not found after installing docker.io"

	# A socket left behind by an engine that died would make dockerd refuse to start.
	if [ -S "$SOCK" ] && ! engine_up; then
		log "removing stale $SOCK"
		rm -f "$SOCK"
	fi

	log "starting dockerd (log: $LOGFILE)"
	# setsid + nohup: the engine outlives this shell and its process group; no terminal fds kept.
	setsid nohup dockerd >"$LOGFILE" 2>&1 </dev/null &
	echo $! >"$PIDFILE"

	# Wait for the socket and a real answer, giving up after $TIMEOUT seconds or if dockerd exits.
	local waited=0
	until [ -S "$SOCK" ] && engine_up; do
		# kill -0 rather than our_dockerd_pid: right after the fork the process may still be
		# named setsid/nohup, before they exec dockerd.
		if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
			rm -f "$PIDFILE"
			tail -n 20 "$LOGFILE" >&2 || true
			die "dockerd exited during startup (see $LOGFILE)"
		fi
		if [ "$waited" -ge "$TIMEOUT" ]; then
			tail -n 20 "$LOGFILE" >&2 || true
			die "dockerd did not answer on $SOCK within ${TIMEOUT}s (still running as pid $(cat "$PIDFILE"); '$0 stop' ends it)"
		fi
		sleep 1
		waited=$((waited + 1))
	done
	log "dockerd $(docker version --format '{{.Server.Version}}') is up after ${waited}s (pid $(cat "$PIDFILE"))"
}

cmd_stop() {
	local pid
	if ! pid=$(our_dockerd_pid); then
		rm -f "$PIDFILE"
		log "no dockerd started by this script is running; nothing to stop"
		return 0
	fi
	need_root stop
	log "stopping dockerd (pid $pid)"
	kill -TERM "$pid"
	# dockerd stops its containers first; give it a while, then insist.
	local waited=0
	while [ -d "/proc/$pid" ] && [ "$waited" -lt 30 ]; do
		sleep 1
		waited=$((waited + 1))
	done
	if [ -d "/proc/$pid" ]; then
		log "dockerd did not stop within 30s; sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$PIDFILE"
	log "dockerd stopped"
}

cmd_base_image() {
	engine_up || die "no Docker engine answers; run '$0 start' first"
	if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
		log "base image $BASE_IMAGE present"
		return 0
	fi
	need_root base-image

	# The root file system is kept under $CACHE so a rerun (e.g. after the engine lost its
	# images) only re-imports it. The .complete marker guards against a half-finished debootstrap.
	local rootfs=$CACHE/rootfs-$SUITE mirror
	mirror=${PERFBUF_MIRROR:-$(host_mirror)}
	if [ ! -f "$rootfs/.complete" ]; then
		command -v debootstrap >/dev/null 2>&1 || { log "installing debootstrap"; apt_install debootstrap; }
		rm -rf "$rootfs" "$rootfs.tmp"
		mkdir -p "$CACHE"
		log "debootstrap --variant=minbase $SUITE from $mirror (about 30 s)"
		debootstrap --variant=minbase "$SUITE" "$rootfs.tmp" "$mirror" >"$CACHE/debootstrap.log" 2>&1 ||
			{ tail -n 20 "$CACHE/debootstrap.log" >&2; die "debootstrap failed (see $CACHE/debootstrap.log)"; }
		# Lay out apt like the official debian image: one deb822 file with the release,
		# its updates and security suites (debootstrap writes a one-line sources.list).
		write_sources "$rootfs.tmp" "$mirror"
		# Keep the image small: the package cache is not needed inside it.
		rm -rf "$rootfs.tmp"/var/cache/apt/archives/*.deb "$rootfs.tmp"/var/lib/apt/lists/*
		touch "$rootfs.tmp/.complete"
		mv "$rootfs.tmp" "$rootfs"
	else
		log "reusing root file system in $rootfs"
	fi
	log "importing $rootfs as $BASE_IMAGE"
	# --exclude keeps our marker out of the image.
	tar -C "$rootfs" --exclude=./.complete --numeric-owner -c . |
		docker import --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
	log "base image $BASE_IMAGE ready"
}

cmd_status() {
	if engine_up; then
		local who="someone else"
		our_dockerd_pid >/dev/null && who="this script (pid $(cat "$PIDFILE"))"
		log "engine $(docker version --format '{{.Server.Version}}') is running, started by $who"
	else
		log "no Docker engine answers"
		return 1
	fi
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
base-image) cmd_base_image ;;
status) cmd_status ;;
*)
	echo "usage: $0 start|stop|base-image|status" >&2
	exit 2
	;;
esac
