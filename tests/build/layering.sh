#!/bin/sh
# The layers stay one-way (docs/design.md): base <- vmm <- core <- api. Fails when a file of a
# layer includes a header of a layer above it (or of anything else of ours but the public
# xseg.h), and when core/ or api/ calls the driver table directly (`drv->`: driver calls belong
# in vmm/). The tools (tools/, any depth) are users of the library: they may include xseg.h and
# their own headers, never an internal base/, vmm/, core/ or api/ one. Inside core/, the wings are
# layered too (wing_rank and wing_order below), so calls between modules point one way. And each
# sub-state of struct dev_alloc (core/device/state.h), and of the process object xseg_rt
# (core/process/procstate.h), is written only by the module that owns it (owners below).
#   layering.sh SOURCE_ROOT
set -u
root=$1
bad=0
# Every check below is one pass of grep or awk over all the files it reads (no process per file
# or per include line), so that the test stays cheap on a loaded machine.

# The layers' includes and core/'s wings, in one awk over base/, vmm/, core/ and api/: a file of a
# layer includes only xseg.h and headers of its own layer or those below it (allowed prefixes per
# layer below). core/ is five wings and a top (core/README.md): a core/ file includes core/ headers
# of its own wing or of a lower one (wing_rank; index/ and process/ are peers that include neither
# each other), and inside a wing only modules earlier in its order (a module: NAME.c and NAME.h; a
# new module must be placed).
wing_rank="index:1 process:1 device:2 policy:3 services:4 top:5"
wing_order="index:block,bins,ptrmap,stats
process:config_keys,config,procstate,history,settings
device:state,device,placement,blockops,retile,sharing,fast,sizes,quarantine,check
policy:capreuse,events,pools,registry,ipc,observe,classic,expandable,release
services:hostquar,hostalloc,spill,sleep,sleeptags,trim,group,sleepwake,idle
top:runtime,snapshot,grow,reclaim,oom,alloc,devops,shutdown"
# Includes allowed to point up: none (sub-state types live in core/device/state.h, below device.h,
# and dev_unlock, which runs dev_check, in core/device/check.h above it). Format: "FILE:HEADER ...".
core_up=""
core_files() { find "$root/core" -name '*.[ch]' | sort; }
check_includes() {
    set --
    for layer in base vmm api; do
        for f in "$root/$layer"/*.c "$root/$layer"/*.h; do
            [ -e "$f" ] && set -- "$@" "$f"
        done
    done
    set -- "$@" $(core_files)
    [ $# -gt 0 ] || return 0
    awk -v ranks="$wing_rank" -v orders="$wing_order" -v up="$core_up" -v root="$root/" '
        BEGIN {
            allowed["base"] = "base"; allowed["vmm"] = "base vmm"
            allowed["core"] = "base vmm core"; allowed["api"] = "base vmm core api"
            n = split(ranks, r, " "); for (i = 1; i <= n; i++) { split(r[i], kv, ":"); rank[kv[1]] = kv[2] }
            n = split(orders, o, /[ \n]+/)
            for (i = 1; i <= n; i++) {
                if (o[i] == "") continue
                w = o[i]; sub(/:.*/, "", w); l = o[i]; sub(/^[^:]*:/, "", l)
                m = split(l, mods, ","); for (j = 1; j <= m; j++) pos[w "/" mods[j]] = j
            }
            nl = 0; nc = 0
        }
        # "top" for a file directly in core/, else its folder; the module key is "WING/NAME"
        function key_of(path,    p, w) {
            p = path; sub(/^core\//, "", p); sub(/\.[^.]*$/, "", p)
            if (index(p, "/") == 0) return "top/" p
            return p
        }
        FNR == 1 {
            rel = substr(FILENAME, length(root) + 1)
            layer = rel; sub(/\/.*/, "", layer)
            me = ""
            if (layer == "core") {
                me = key_of(rel); mywing = me; sub(/\/.*/, "", mywing)
                if (!(mywing in rank))
                    cmsg[++nc] = rel ": folder " mywing " is not a wing of core/ (tests/build/layering.sh wing_rank): place it"
                else if (!(me in pos))
                    cmsg[++nc] = rel ": module " me " is not in wing_order (tests/build/layering.sh): place it"
            }
        }
        /^[[:space:]]*#[[:space:]]*include[[:space:]]*"/ {
            inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
            ok = (inc == "xseg.h")
            na = split(allowed[layer], a, " ")
            for (i = 1; i <= na; i++) if (index(inc, a[i] "/") == 1) ok = 1
            if (!ok)
                lmsg[++nl] = rel ":" FNR ": includes \"" inc "\" (a " layer "/ file may include: " allowed[layer] ", xseg.h)"
            if (layer == "core" && (me in pos) && index(inc, "core/") == 1) {
                if (index(" " up " ", " " rel ":" inc " ")) next
                hk = key_of(inc); hw = hk; sub(/\/.*/, "", hw)
                if (!(hk in pos))
                    cmsg[++nc] = rel ":" FNR ": includes \"" inc "\", which is in no wing"
                else if (hw == mywing) {
                    if (pos[hk] > pos[me])
                        cmsg[++nc] = rel ":" FNR ": includes \"" inc "\", later in the " mywing " wing (calls inside a wing point down its order)"
                } else if (rank[hw] >= rank[mywing])
                    cmsg[++nc] = rel ":" FNR ": includes \"" inc "\": the " hw " wing is not below " mywing " (index, process <- device <- policy <- services <- top)"
            }
        }
        END { for (i = 1; i <= nl; i++) print lmsg[i]; for (i = 1; i <= nc; i++) print cmsg[i] }' "$@"
}

# Each sub-state of struct dev_alloc (core/device/state.h) is written only by its module: a write
# (`d->SUB.field =`, `op=`, `++`, `--`, also through an index or a member) elsewhere fails.
# "SUB: files" (basenames in core/); reads go through accessors or stay reads.
owners="ev:events.c cap:device.c priv:pools.c sleep:sleep.c cr:capreuse.c
acct:device.c,device.h,alloc.c,grow.c,oom.c,devops.c,classic.c,release.c fast:fast.c,fast.h life:placement.c,placement.h quar:quarantine.c
exp:expandable.c spill:spill.c tags:sleeptags.c"
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
        END { for (i = 1; i <= k; i++) printf "%s", hits[i] }' $(core_files) "$root"/api/*.[ch]
}
# Likewise each sub-state of the process object xseg_rt (core/process/procstate.h) is written (assigned,
# stored atomically, or its lock taken) only by its module; procstate.c defines it.
rt_owners="rt:runtime.c settings:settings.c idle:idle.c hist:history.c obs:observe.c reg:registry.c ipc:ipc.c oom:snapshot.c
host:hostalloc.c group:group.c"
check_rt_owners() { # one grep over every file, then each hit checked against its sub-state's owner
    grep -nE "xseg_rt\.[a-z]+\.[a-z_]+(\[[^]]*\])*(\.[a-z_]+)*[[:space:]]*([-+*/|&^]?=[^=]|\+\+|--)|(atomic_(store|fetch_[a-z]+|exchange|compare_exchange_[a-z]+)(_explicit)?|mutex_(lock|unlock)|pthread_[a-z_]+)\(&xseg_rt\.[a-z]+\." \
        $(core_files) "$root"/api/*.[ch] |
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
        grep -rn --include='*.[ch]' 'drv->' "$root/$layer" 2>/dev/null |
            sed "s|^$root/||; s|\$|   <- a driver call outside vmm/: add a vmm/ function|"
    done
} )
if [ -n "$out" ]; then
    echo "layering violations:"; echo "$out"; exit 1
fi
n=$(cat "$root"/base/*.[ch] "$root"/vmm/*.[ch] $(core_files) "$root"/api/*.[ch] | grep -c '^[[:space:]]*#[[:space:]]*include[[:space:]]*"')
echo "ok: $n includes, all pointing down (base <- vmm <- core <- api; inside core/: index, process <- device <- policy <- services <- top, each wing in its order); dev_alloc and xseg_rt sub-states written only by their modules; no drv-> in core/ or api/; tools/ include only xseg.h and their own headers"
