#!/bin/sh
# The layers stay one-way in calls too (docs/design.md): base <- vmm <- core <- api. layering.sh
# reads includes, which cannot see a call through a header a layer may include (xseg.h declares
# the public API, which api/ defines). This reads the objects instead: a symbol that a base/,
# vmm/ or core/ object leaves undefined must not be defined by an object of a layer above it
# (e.g. core/ calling xseg_last_error(), defined in api/: core uses base/error.h's err_message).
#   layering_calls.sh ARCHIVE      (the build's libxseg_internal.a; members named LAYER_FILE.c.o)
set -eu
archive=$1
[ -f "$archive" ] || { echo "layering_calls.sh: $archive not found"; exit 1; }
nm -A "$archive" 2>/dev/null | awk '
    BEGIN { rank["base"] = 1; rank["vmm"] = 2; rank["core"] = 3; rank["api"] = 4 }
    {
        # "ARCHIVE:MEMBER: VALUE TYPE NAME" or "ARCHIVE:MEMBER:                  U NAME"
        n = split($1, parts, ":"); member = parts[n - 1]; sub(/.*\//, "", member)
        layer = member; sub(/_.*/, "", layer)
        if (!(layer in rank)) next
        if ($(NF - 1) == "U") { use[++nu] = layer SUBSEP member SUBSEP $NF; next }
        if ($(NF - 1) ~ /^[TDBRVWGS]$/) { def[$NF] = layer; defm[$NF] = member }
        objs++
    }
    END {
        if (objs == 0) { print "layering_calls.sh: no base_/vmm_/core_/api_ objects in the archive"; exit 1 }
        bad = 0
        for (i = 1; i <= nu; i++) {
            split(use[i], u, SUBSEP)
            if ((u[3] in def) && rank[def[u[3]]] > rank[u[1]]) {
                printf "%s calls %s, defined in %s (a %s/ object calls only its own layer and those below it)\n",
                       u[2], u[3], defm[u[3]], u[1]
                bad = 1
            }
        }
        if (bad) exit 1
        print "layering_calls.sh: no call points up from base/, vmm/ or core/ (" nu " undefined references read)"
    }'
