#!/bin/sh
# /usr/local/bin/redis-server of the stand-in redis image, ahead of Debian's /usr/bin/redis-server
# on PATH. The official image builds Redis with protected mode off by default (it is reached from
# other containers); Debian's is built with it on, which refuses every client but loopback when no
# password is set. This restores the official default, right after the configuration file when
# one comes first, so that a `--protected-mode` given on the command line still comes later and
# wins.
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    conf="$1"
    shift
    exec /usr/bin/redis-server "$conf" --protected-mode no "$@"
fi
exec /usr/bin/redis-server --protected-mode no "$@"
