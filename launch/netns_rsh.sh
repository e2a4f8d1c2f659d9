#!/bin/sh
# Open MPI's remote-shell agent for --launcher netns: "netns_rsh.sh HOST COMMAND..." runs
# COMMAND inside the network namespace HOST, as ssh would run it on a machine. The command
# also gets its own hostname (a UTS namespace): Open MPI names its shared-memory files by
# hostname, and two emulated hosts with one name would share (and corrupt) them.
host="$1"; shift
exec ip netns exec "$host" unshare --uts -- /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' "$host" "$*"
