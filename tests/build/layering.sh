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
# Every check below is one pass of grep or awk over all the files it reads (no process per file
# or per include line), so that the test stays cheap on a loaded machine.

# The layers' includes and core/'s module order, in one awk over base/, vmm/, core/ and api/:
# a file of a layer includes only xseg.h and headers of its own layer or those below it (allowed
# prefixes per layer below); a core/ file includes only core/ headers of its own module or of
# modules earlier in core_order (a module: NAME.c and NAME.h; a new module must be placed).
core_order="config_keys config stats block bins ptrmap procstate history settings hostalloc state lifetime device fast check capreuse pools ipc observe expandable
events release sleep trim group idle runtime snapshot alloc shutdown"
# Includes allowed to point up: none (sub-state types live in core/state.h, below device.h, and
# dev_unlock, which runs dev_check, in core/check.h above it). Format: "FILE:HEADER ...".
core_up=""
check_includes() {
    set --
    for layer in base vmm core api; do
        for f in "$root/$layer"/*.c "$root/$layer"/*.h; do
            [ -e "$f" ] && set -- "$@" "$f"
        done
    done
    [ $# -gt 0 ] || return 0
    awk -v order="$core_order" -v up="$core_up" '
        BEGIN {
            allowed["base"] = "base"; allowed["vmm"] = "base vmm"
            allowed["core"] = "base vmm core"; allowed["api"] = "base vmm core api"
            n = split(order, o, /[ \n]+/); for (i = 1; i <= n; i++) if (o[i] != "" && !(o[i] in pos)) pos[o[i]] = i
            nl = 0; nc = 0
        }
        FNR == 1 {
            name = FILENAME; sub(/.*\//, "", name)
            layer = FILENAME; sub(/\/[^\/]*$/, "", layer); sub(/.*\//, "", layer)
            mod = name; sub(/\.[^.]*$/, "", mod)
            me = (layer == "core" && (mod in pos)) ? pos[mod] : 0
            if (layer == "core" && !me)
                cmsg[++nc] = "core/" name ": module " mod " is not in core_order (tests/build/layering.sh): place it"
        }
        /^[[:space:]]*#[[:space:]]*include[[:space:]]*"/ {
            inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
            ok = (inc == "xseg.h")
            na = split(allowed[layer], a, " ")
            for (i = 1; i <= na; i++) if (index(inc, a[i] "/") == 1) ok = 1
            if (!ok)
                lmsg[++nl] = layer "/" name ":" FNR ": includes \"" inc "\" (a " layer "/ file may include: " allowed[layer] ", xseg.h)"
            if (layer == "core" && me && index(inc, "core/") == 1) {
                h = substr(inc, 6); hm = h; sub(/\.[^.]*$/, "", hm)
                if (index(" " up " ", " " name ":" h " ")) next
                if (!(hm in pos) || pos[hm] > me)
                    cmsg[++nc] = "core/" name ":" FNR ": includes \"core/" h "\", above " mod " in core_order (calls between core/ modules point down)"
            }
        }
        END { for (i = 1; i <= nl; i++) print lmsg[i]; for (i = 1; i <= nc; i++) print cmsg[i] }' "$@"
}

# Each sub-state of struct dev_alloc (core/state.h) is written only by its module: a write
# (`d->SUB.field =`, `op=`, `++`, `--`, also through an index or a member) elsewhere fails.
# "SUB: files" (basenames in core/); reads go through accessors or stay reads.
owners="ev:events.c cap:device.c priv:pools.c sleep:sleep.c cr:capreuse.c
acct:device.c,device.h,alloc.c,release.c fast:fast.c,fast.h life:lifetime.c,lifetime.h"
check_owners() { # one awk over core/ and api/; the hits listed sub-state by sub-state
    awk -v owners="$owners" -v root="$root/" '
        BEGIN {
            n = split(owners, o, /[ \n]+/)
            for (i = 1; i <= n; i++) {
                if (o[i] == "") continue
                k++; s[k] = o[i]; sub(/:.*/, "", s[k]); fl[k] = o[i]; sub(/^[^:]*:/, "", fl[k])
                re[k] = "(->|\\.)" s[k] "\\.[a-z_]+(\\[[^]]*\\])*(\\.[a-z_]+)*[[:space:]]*([-+*/|&^]?=[^=]|\\+\\+|--)"
            }
        }
        FNR == 1 { base = FILENAME; sub(/.*\//, "", base); rel = substr(FILENAME, length(root) + 1) }
        {
            for (i = 1; i <= k; i++)
                if (index("," fl[i] ",", "," base ",") == 0 && $0 ~ re[i])
                    hits[i] = hits[i] rel ":" FNR ":" $0 "   <- writes dev_alloc." s[i] " outside its module (" fl[i] ")\n"
        }
        END { for (i = 1; i <= k; i++) printf "%s", hits[i] }' "$root"/core/*.[ch] "$root"/api/*.[ch]
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
    check_includes
    check_owners
    check_rt_owners
    # tools/: one awk over every C file, the hits file by file (angle-bracket includes first)
    find "$root/tools" -name '*.[ch]' | sort | xargs -r awk -v root="$root/" '
        function flush() { printf "%s%s", angle, quote; angle = quote = "" }
        FNR == 1 { flush(); rel = substr(FILENAME, length(root) + 1) }
        /^[[:space:]]*#[[:space:]]*include[[:space:]]*<(base|vmm|core|api)\// {
            angle = angle rel ":" FNR ":" $0 "   <- tools use the public xseg.h only\n" }
        /^[[:space:]]*#[[:space:]]*include[[:space:]]*"/ && $0 !~ /"(xseg\.h|tools\/[^"]*)"/ {
            quote = quote rel ":" FNR ":" $0 "   <- tools may include xseg.h and tools/ headers\n" }
        END { flush() }'
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
