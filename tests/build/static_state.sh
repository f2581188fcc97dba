#!/bin/sh
# The library's writable statics (file scope or in a function, process-wide or per thread) are
# the process object xseg_rt (core/process/procstate.h) and the list below, each with why it stays
# outside; a new one fails until it is folded into its module's sub-state or listed here with a
# reason (docs/design.md, "Process state and teardown"). Read from the objects' symbol tables,
# so a static inside a function (NAME.N, listed as NAME) is seen as well as one at file scope.
#   static_state.sh LIBXSEG_INTERNAL_A
set -u
archive=$1
# "object-file-suffix:symbol  reason" (the object's name ends with the source's path, / as _).
allowed='
core_process_procstate.c.o:xseg_rt the process object
base_error.c.o:err_msg per thread: the error message
base_fork.c.o:fork_mutex the fork table: written by constructors before main
base_fork.c.o:fork_child_hook the fork table: written by constructors before main
base_fork.c.o:fork_installed the fork table: written by constructors before main
base_witness.c.o:witness_held per thread: the ranks it holds
base_lock.c.o:self per thread: its address names the lock holder (debug_level >= 1)
base_hostmem.c.o:hostmem_armed the host-allocation test seam (tests arm it)
base_hostmem.c.o:hostmem_count the host-allocation test seam
base_hostmem.c.o:hostmem_hit the host-allocation test seam
base_hostmem.c.o:hostmem_nlive the host-allocation test seam
base_hostmem.c.o:hostmem_nth the host-allocation test seam
base_log.c.o:log_sink where warnings go (stderr when NULL): set by a test or a host, not process state xseg_shutdown resets
base_afile.c.o:seq mixed into random bits when getrandom fails: its value does not matter
vmm_driver.c.o:drv the driver table, resolved once, kept across xseg_shutdown
vmm_driver.c.o:drv_table the driver table, resolved once
vmm_driver.c.o:drv_once the driver table, resolved once
vmm_driver.c.o:drv_load_status the driver load result, once
vmm_driver.c.o:drv_load_msg the driver load result, once
vmm_driver.c.o:drv_dmabuf_fn the optional dma-buf entry point, resolved once with the table
vmm_driver.c.o:drv_memcpy_batch the optional cuMemcpyBatchAsync entry point, resolved once with the table (drv_batch_hide: tests of the fallback)
vmm_driver.c.o:drv_batch_resolved the same, as resolved (what drv_batch_hide(false) restores)
vmm_driver.c.o:va_oom per thread: the last call ran out of address space
vmm_driver.c.o:buf per thread: an unknown error code'"'"'s name
vmm_classic.c.o:owner_oom per thread: the last owned growth got no memory from the owner of its pool
vmm_segment.c.o:seg_proc vmm'"'"'s own state (layers point one way: not in core'"'"'s object)
vmm_host.c.o:host_proc vmm'"'"'s own state
vmm_kernel.c.o:vkern_proc vmm'"'"'s own state: the allocator'"'"'s kernel modules per context
vmm_ipc.c.o:ipc_types_cache a per-device driver answer, resolved once
core_process_config.c.o:cfg_ignored_noted print-once notices
core_device_fast.c.o:fast_tls per thread: the last slot, the first a malloc tries, the last front and its lanes
core_process_history.c.o:uw_backtrace the unwinder, resolved once
core_process_history.c.o:uw_getip the unwinder, resolved once
core_process_history.c.o:uw_getcfa the unwinder, resolved once
core_process_history.c.o:uw_once the unwinder, resolved once
core_process_history.c.o:demangle the demangler, resolved once
core_process_history.c.o:demangle_once the demangler, resolved once
core_process_history.c.o:cache_key the per-thread stack cache'"'"'s key, made once
core_process_history.c.o:tls_cache per thread: the stack cache
core_process_history.c.o:in_callback per thread: inside the user'"'"'s stack callback
api_api.c.o:api_last_device per thread: the last device used
api_pools.c.o:pools_seq pool ids: never reset, so an id from before xseg_shutdown names no later pool
api_torch.c.o:torch_checked set by the PyTorch adapter, which outlives xseg_shutdown
'
# Every data symbol in a writable section (.data*, .bss*, .tdata, .tbss; not .data.rel.ro*).
found=$(objdump -t "$archive" | awk '
    /^In archive/ { next }
    /file format/ { obj = $1; sub(/:$/, "", obj); sub(/.*\//, "", obj); next }
    /\t/ { # VALUE FLAGS SECTION<tab>SIZE NAME; objects are flagged O, thread-locals are not
        split($0, half, "\t"); n = split(half[1], f, " "); sec = f[n]
        m = split(half[2], g, " "); name = g[m]
        # (__odr_asan.*: markers AddressSanitizer adds, not xseg state)
        if (sec ~ /^\.(data|bss|tdata|tbss)/ && sec !~ /^\.data\.rel\.ro/ && name !~ /^\./ &&
            name !~ /^__odr_asan/ && half[1] !~ / d /)
            print obj ":" name
    }' | sort -u)
[ -n "$found" ] || { echo "no writable symbol found in $archive: objdump output not understood"; exit 1; }
bad=0
for s in $found; do
    # A static inside a function is NAME.N, N the compiler's count of the file's function statics
    # (another static in the file changes it): listed without it.
    obj=${s%%:*}; sym=$(echo "${s#*:}" | sed 's/\.[0-9][0-9]*$//')
    ok=0
    for suffix in $(echo "$allowed" | awk 'NF { print $1 }'); do
        case "$obj:$sym" in *"$suffix") ok=1; break ;; esac
    done
    if [ $ok = 0 ]; then
        echo "$obj: $sym is writable process state outside xseg_rt: fold it into its module's sub-state (core/process/procstate.h) or list it with its reason in tests/build/static_state.sh"
        bad=1
    fi
done
[ $bad = 0 ] && echo "ok: $(echo "$found" | wc -l) writable statics, each xseg_rt or listed with its reason"
exit $bad
