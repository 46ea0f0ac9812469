#!/bin/sh
# The stand-in redis image's entrypoint (docker/podman/standins/redis.Containerfile): as the official
# image's, `redis-server ...` (or only options, or a .conf file) runs as the redis user after /data
# is made its own; any other command runs as given (the Sentinel stack's `sh -c`).
set -e
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
    set -- redis-server "$@"
fi
if [ "$1" = redis-server ] && [ "$(id -u)" = 0 ]; then
    find . \! -user redis -exec chown redis '{}' +
    exec setpriv --reuid=redis --regid=redis --init-groups "$@"
fi
exec "$@"
