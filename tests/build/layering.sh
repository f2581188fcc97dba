#!/bin/sh
# The layers stay one-way (docs/design.md): base <- vmm <- core <- api. Fails when a file of a
# layer includes a header of a layer above it (or of anything else of ours but the public
# xseg.h), and when core/ or api/ calls the driver table directly (`drv->`: driver calls belong
# in vmm/). The tools (tools/, any depth) are users of the library: they may include xseg.h and
# their own headers, never an internal base/, vmm/, core/ or api/ one. Inside core/, the modules
# are layered too (core_order below): a core/ file includes only core/ headers of its own module or
# of modules earlier in the list, so calls between modules point one way. And each sub-state of
# struct dev_alloc (core/state.h), and of the process object xseg_rt (core/procstate.h), is written
# only by the module that owns it (owners below).
#   layering.sh SOURCE_ROOT
set -u
root=$1
bad=0
check() { # layer, allowed include prefixes (space separated)
    layer=$1; allowed=$2
    for f in "$root/$layer"/*.c "$root/$layer"/*.h; do
        [ -e "$f" ] || continue
        grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
        sed 's/^\([0-9]*\):[^"]*"\([^"]*\)".*/\1 \2/' |
        while read -r line inc; do
            ok=0
            [ "$inc" = xseg.h ] && ok=1
            for a in $allowed; do
                case $inc in "$a"/*) ok=1 ;; esac
            done
            [ $ok = 1 ] || echo "$layer/$(basename "$f"):$line: includes \"$inc\" (a $layer/ file may include: $allowed, xseg.h)"
        done
    done
}
# core/'s modules from the bottom up (a module: NAME.c and NAME.h). A new module must be placed.
core_order="config_keys config stats block bins ptrmap procstate history settings hostalloc state lifetime device fast check capreuse pools ipc observe expandable
events release sleep trim group idle runtime snapshot alloc shutdown"
# Includes allowed to point up: none (sub-state types live in core/state.h, below device.h, and
# dev_unlock, which runs dev_check, in core/check.h above it). Format: "FILE:HEADER ...".
core_up=""
core_pos() { # module name -> its position in core_order (empty when absent)
    i=0
    for m in $core_order; do
        i=$((i + 1))
        [ "$m" = "$1" ] && { echo $i; return; }
    done
}
check_core_order() {
    for f in "$root"/core/*.c "$root"/core/*.h; do
        [ -e "$f" ] || continue
        name=$(basename "$f"); mod=${name%.*}
        me=$(core_pos "$mod")
        if [ -z "$me" ]; then
            echo "core/$name: module $mod is not in core_order (tests/build/layering.sh): place it"
            continue
        fi
        grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"core/' "$f" |
        sed 's/^\([0-9]*\):[^"]*"core\/\([^"]*\)".*/\1 \2/' |
        while read -r line inc; do
            them=$(core_pos "${inc%.*}")
            case " $core_up " in *" $name:$inc "*) continue ;; esac
            [ -n "$them" ] && [ "$them" -le "$me" ] ||
                echo "core/$name:$line: includes \"core/$inc\", above $mod in core_order (calls between core/ modules point down)"
        done
    done
}

# Each sub-state of struct dev_alloc (core/state.h) is written only by its module: a write
# (`d->SUB.field =`, `op=`, `++`, `--`, also through an index or a member) elsewhere fails.
# "SUB: files" (basenames in core/); reads go through accessors or stay reads.
owners="ev:events.c cap:device.c priv:pools.c sleep:sleep.c cr:capreuse.c
acct:device.c,device.h,alloc.c,release.c fast:fast.c,fast.h life:lifetime.c,lifetime.h"
check_owners() {
    for o in $owners; do
        sub=${o%%:*}; files=,${o#*:},
        for f in "$root"/core/*.[ch] "$root"/api/*.[ch]; do
            case $files in *,"$(basename "$f")",*) continue ;; esac
            grep -nE "(->|\.)$sub\.[a-z_]+(\[[^]]*\])*(\.[a-z_]+)*[[:space:]]*([-+*/|&^]?=[^=]|\+\+|--)" "$f" |
                sed "s|^|${f#"$root"/}:|; s|\$|   <- writes dev_alloc.$sub outside its module (${o#*:})|"
        done
    done
}

# Likewise each sub-state of the process object xseg_rt (core/procstate.h) is written (assigned,
# stored atomically, or its lock taken) only by its module; procstate.c defines it.
rt_owners="rt:runtime.c settings:settings.c idle:idle.c hist:history.c obs:observe.c ipc:ipc.c oom:snapshot.c
host:hostalloc.c group:group.c"
check_rt_owners() { # one grep over every file, then each hit checked against its sub-state's owner
    grep -nE "xseg_rt\.[a-z]+\.[a-z_]+(\[[^]]*\])*(\.[a-z_]+)*[[:space:]]*([-+*/|&^]?=[^=]|\+\+|--)|(atomic_(store|fetch_[a-z]+|exchange|compare_exchange_[a-z]+)(_explicit)?|mutex_(lock|unlock)|pthread_[a-z_]+)\(&xseg_rt\.[a-z]+\." \
        "$root"/core/*.[ch] "$root"/api/*.[ch] |
    awk -v owners="$rt_owners" -v root="$root/" '
        BEGIN { n = split(owners, o, " "); for (i = 1; i <= n; i++) { split(o[i], kv, ":"); own[kv[1]] = kv[2] } }
        {
            file = $0; sub(/:.*/, "", file); base = file; sub(/.*\//, "", base)
            rest = $0
            while (match(rest, /xseg_rt\.[a-z]+\./)) {
                sub_ = substr(rest, RSTART + 8, RLENGTH - 9); rest = substr(rest, RSTART + RLENGTH)
                if (!(sub_ in own) || base == own[sub_] || base == "procstate.c") continue
                line = $0; sub(root, "", line)
                print line "   <- writes xseg_rt." sub_ " outside its module (" own[sub_] ")"
            }
        }'
}

out=$( {
    check base "base"
    check vmm "base vmm"
    check core "base vmm core"
    check api "base vmm core api"
    check_core_order
    check_owners
    check_rt_owners
    find "$root/tools" -name '*.[ch]' | sort | while read -r f; do
        grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*<\(base\|vmm\|core\|api\)/' "$f" |
            sed "s|^|${f#"$root"/}:|; s|\$|   <- tools use the public xseg.h only|"
        grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" | grep -v '"\(xseg\.h\|tools/[^"]*\)"' |
            sed "s|^|${f#"$root"/}:|; s|\$|   <- tools may include xseg.h and tools/ headers|"
    done
    for layer in core api; do
        grep -n 'drv->' "$root/$layer"/*.c "$root/$layer"/*.h 2>/dev/null |
            sed "s|^$root/||; s|\$|   <- a driver call outside vmm/: add a vmm/ function|"
    done
} )
if [ -n "$out" ]; then
    echo "layering violations:"; echo "$out"; exit 1
fi
n=$(cat "$root"/base/*.[ch] "$root"/vmm/*.[ch] "$root"/core/*.[ch] "$root"/api/*.[ch] | grep -c '^[[:space:]]*#[[:space:]]*include[[:space:]]*"')
echo "ok: $n includes, all pointing down (base <- vmm <- core <- api; inside core/: $(echo "$core_order" | tr '\n' ' ' | sed 's/ / <- /g')); dev_alloc and xseg_rt sub-states written only by their modules; no drv-> in core/ or api/; tools/ include only xseg.h and their own headers"
