/*
 * Graphs as a capture builds them, the graph-query entry points xseg uses, and executable graphs
 * (instantiate, launch, destroy) for the tests that replay a capture.
 *
 * A graph is a list of nodes in creation order; a node's dependencies are fixed when it is
 * created (cudaemu has no cuGraphAddDependencies), so the graph is a DAG by construction and
 * creation order is a topological order. Only the node kinds a capture made through cudaemu can
 * contain exist: empty nodes (cuGraphAddEmptyNode), kernel nodes (cudaemu_stream_work, standing
 * for a kernel launch) and memset / memcpy nodes (the async calls of host.c, with their
 * arguments). Recording an event or waiting on one adds no node: as with the driver, it moves
 * dependency sets between streams (stream.c).
 *
 * Rules, from the driver API documentation of each entry point: NULL out-parameters, a node
 * list with duplicates, a dependency of another graph, an unknown graph, node or executable graph
 * are CUDA_ERROR_INVALID_VALUE. Queries that return arrays follow the documented convention: a
 * NULL array asks for the count; a count larger than needed gets NULL-padded entries and the real
 * count back. Edge data is always the default (zeroed) here.
 *
 * Executable graphs: cuGraphInstantiate copies the graph's memset and memcpy operations in
 * creation order, so the exec outlives its graph as the driver's does (a graph still being
 * captured may be instantiated: the documentation permits every operation but destroy and node
 * removal on it). cuGraphLaunch performs them at once on the calling thread (pending work on a
 * held stream, like the async calls), after checking every device operand: each byte of it must
 * be device memory (devmem.c) mapped with the access the operation needs for the current
 * device, else CUDA_ERROR_ILLEGAL_ADDRESS and nothing runs (a GPU would fault at some later
 * synchronization and lose its context). Kernel and empty nodes do nothing. Launching into a
 * capturing stream is CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture (the
 * driver refuses it: reported on an H200, driver 580; not modelled as a child graph node).
 * All under emu.lock.
 */
#include <stdlib.h>
#include <string.h>

#include "cudaemu/emu.h"

CUgraphNode emu_node_resolve_locked(CUgraphNode n)
{
    return n ? emu_map_get(&emu.nodes, (uint64_t)(uintptr_t)n) : NULL;
}

static CUgraph graph_resolve_locked(CUgraph g)
{
    return g ? emu_map_get(&emu.graphs, (uint64_t)(uintptr_t)g) : NULL;
}

static CUgraphExec exec_resolve_locked(CUgraphExec x)
{
    return x ? emu_map_get(&emu.execs, (uint64_t)(uintptr_t)x) : NULL;
}

CUgraph emu_graph_new_locked(void)
{
    CUgraph g = calloc(1, sizeof *g);
    if (!g || emu_map_put(&emu.graphs, (uint64_t)(uintptr_t)g, g)) {
        free(g);
        return NULL;
    }
    return g;
}

void emu_graph_free_locked(CUgraph g)
{
    emu_map_del(&emu.graphs, (uint64_t)(uintptr_t)g);
    for (size_t i = 0; i < g->nnodes; i++) {
        CUgraphNode n = g->nodes[i];
        emu_map_del(&emu.nodes, (uint64_t)(uintptr_t)n);
        free(n->deps);
        free(n);
    }
    free(g->nodes);
    free(g);
}

CUgraphNode emu_graph_add_locked(CUgraph g, CUgraphNodeType type, const CUgraphNode *deps, size_t n)
{
    if (g->nnodes == g->capnodes) {
        size_t ncap = g->capnodes ? g->capnodes * 2 : 16;
        CUgraphNode *p = realloc(g->nodes, ncap * sizeof *p);
        if (!p)
            return NULL;
        g->nodes = p;
        g->capnodes = ncap;
    }
    CUgraphNode node = calloc(1, sizeof *node);
    CUgraphNode *d = n ? malloc(n * sizeof *d) : NULL;
    if (!node || (n && !d) || emu_map_put(&emu.nodes, (uint64_t)(uintptr_t)node, node)) {
        free(node);
        free(d);
        return NULL;
    }
    if (n)
        memcpy(d, deps, n * sizeof *d);
    node->graph = g;
    node->type = type;
    node->deps = d;
    node->ndeps = n;
    g->nodes[g->nnodes++] = node;
    return node;
}

CUresult emu_capture_add_locked(CUstream s, CUgraphNodeType type, const struct emu_op *op)
{
    if (s->cap->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    CUgraphNode n = emu_graph_add_locked(s->cap->graph, type, s->deps.v, s->deps.n);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (op)
        n->op = *op;
    /* A failed update leaves the node in the graph with the old dependencies: still ordered. */
    return emu_nodeset_update(&s->deps, &n, 1, false) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

static bool nodes_contain(const CUgraphNode *v, size_t n, CUgraphNode x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

int emu_nodeset_update(struct emu_nodeset *set, const CUgraphNode *nodes, size_t n, bool add)
{
    size_t need = (add ? set->n : 0) + n;
    if (need > set->cap) {
        size_t ncap = set->cap ? set->cap : 4;
        while (ncap < need)
            ncap *= 2;
        CUgraphNode *v = realloc(set->v, ncap * sizeof *v);
        if (!v)
            return -1;
        set->v = v;
        CUgraphEdgeData *e = realloc(set->edges, ncap * sizeof *e);
        if (!e)
            return -1;
        memset(e, 0, ncap * sizeof *e);
        set->edges = e;
        set->cap = ncap;
    }
    /* @p nodes may alias set->v (a stream's own array passed back): copy what is kept first. */
    size_t keep = add ? set->n : 0;
    CUgraphNode tmp[16];
    CUgraphNode *src = (CUgraphNode *)nodes;
    if (n && nodes >= set->v && nodes < set->v + set->cap) {
        src = n <= 16 ? tmp : malloc(n * sizeof *src);
        if (!src)
            return -1;
        memcpy(src, nodes, n * sizeof *src);
    }
    size_t out = keep;
    for (size_t i = 0; i < n; i++)
        if (!nodes_contain(set->v, out, src[i]))
            set->v[out++] = src[i];
    set->n = out;
    if (src != nodes && src != tmp)
        free(src);
    return 0;
}

void emu_nodeset_free(struct emu_nodeset *set)
{
    free(set->v);
    free(set->edges);
    *set = (struct emu_nodeset){0};
}

/* Non-default edge data is not modelled. */
static bool edges_default(const CUgraphEdgeData *e, size_t n)
{
    static const CUgraphEdgeData zero;
    for (size_t i = 0; e && i < n; i++)
        if (memcmp(&e[i], &zero, sizeof zero))
            return false;
    return true;
}

/* Are @p deps (count @p n) valid, distinct nodes of @p g? */
static bool deps_valid_locked(CUgraph g, const CUgraphNode *deps, size_t n)
{
    if (n && !deps)
        return false;
    for (size_t i = 0; i < n; i++) {
        CUgraphNode d = emu_node_resolve_locked(deps[i]);
        if (!d || d->graph != g || nodes_contain(deps, i, deps[i]))
            return false;
    }
    return true;
}

/* The documented array-query convention. */
static void fill_nodes(CUgraphNode *out, CUgraphEdgeData *edges, size_t *count, CUgraphNode *v, size_t n)
{
    if (!out) {
        *count = n;
        return;
    }
    size_t want = *count;
    for (size_t i = 0; i < want; i++) {
        out[i] = i < n ? v[i] : NULL;
        if (edges)
            memset(&edges[i], 0, sizeof edges[i]);
    }
    *count = want < n ? want : n;
}

CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                     const CUgraphNode *dependencies, size_t numDependencies)
{
    EMU_ENTER(cuGraphAddEmptyNode);
    if (!phGraphNode)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUgraph g = graph_resolve_locked(hGraph);
    if (!g || !deps_valid_locked(g, dependencies, numDependencies)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        CUgraphNode n = emu_graph_add_locked(g, CU_GRAPH_NODE_TYPE_EMPTY, dependencies, numDependencies);
        if (!n)
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *phGraphNode = n;
    }
    emu_unlock();
    return r;
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    EMU_ENTER(cuGraphGetNodes);
    if (!numNodes)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    CUgraph g = graph_resolve_locked(hGraph);
    if (g)
        fill_nodes(nodes, NULL, numNodes, g->nodes, g->nnodes);
    emu_unlock();
    return g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGraphNodeGetDependencies(CUgraphNode hNode, CUgraphNode *dependencies,
                                            CUgraphEdgeData *edgeData, size_t *numDependencies)
{
    EMU_ENTER(cuGraphNodeGetDependencies);
    if (!numDependencies || (edgeData && !dependencies))
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    CUgraphNode n = emu_node_resolve_locked(hNode);
    if (n)
        fill_nodes(dependencies, edgeData, numDependencies, n->deps, n->ndeps);
    emu_unlock();
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    EMU_ENTER(cuGraphNodeGetType);
    if (!type)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    CUgraphNode n = emu_node_resolve_locked(hNode);
    if (n)
        *type = n->type;
    emu_unlock();
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* A graph still being captured belongs to the capture ("all operations other than destroy and
 * node removal are permitted on the graph while the capture sequence is in progress"): cudaemu
 * refuses the destroy with CUDA_ERROR_ILLEGAL_STATE. */
CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph)
{
    EMU_ENTER(cuGraphDestroy);
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUgraph g = graph_resolve_locked(hGraph);
    if (!g)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (g->capture)
        r = CUDA_ERROR_ILLEGAL_STATE;
    else
        emu_graph_free_locked(g);
    emu_unlock();
    return r;
}

/* ---- capture dependencies ---- */

CUresult CUDAAPI cuStreamUpdateCaptureDependencies(CUstream hStream, CUgraphNode *dependencies,
                                                   const CUgraphEdgeData *dependencyData,
                                                   size_t numDependencies, unsigned int flags)
{
    EMU_ENTER(cuStreamUpdateCaptureDependencies);
    if (flags != CU_STREAM_ADD_CAPTURE_DEPENDENCIES && flags != CU_STREAM_SET_CAPTURE_DEPENDENCIES)
        return CUDA_ERROR_INVALID_VALUE;
    if (numDependencies && !dependencies)
        return CUDA_ERROR_INVALID_VALUE;
    if (!edges_default(dependencyData, numDependencies))
        return CUDA_ERROR_NOT_SUPPORTED;
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUstream s = emu_stream_resolve_locked(hStream);
    if (!s)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!s->cap)
        r = CUDA_ERROR_ILLEGAL_STATE;
    else if (s->cap->invalidated)
        r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (!deps_valid_locked(s->cap->graph, dependencies, numDependencies))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (emu_nodeset_update(&s->deps, dependencies, numDependencies,
                                flags == CU_STREAM_ADD_CAPTURE_DEPENDENCIES))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    emu_unlock();
    return r;
}

/* ---- executable graphs ---- */

CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    EMU_ENTER(cuGraphInstantiate);
    const unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    /* Documented: AUTO_FREE_ON_LAUNCH "cannot be used in conjunction" with DEVICE_LAUNCH. */
    if (!phGraphExec || (flags & ~known) ||
        ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) &&
         (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)))
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUgraph g = graph_resolve_locked(hGraph);
    CUgraphExec x = NULL;
    if (!g) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (!(x = calloc(1, sizeof *x)) || (g->nnodes && !(x->ops = malloc(g->nnodes * sizeof *x->ops)))) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        for (size_t i = 0; i < g->nnodes; i++)
            if (g->nodes[i]->op.kind)
                x->ops[x->nops++] = g->nodes[i]->op;
        if (emu_map_put(&emu.execs, (uint64_t)(uintptr_t)x, x))
            r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    emu_unlock();
    if (r != CUDA_SUCCESS) {
        if (x)
            free(x->ops);
        free(x);
        return r;
    }
    *phGraphExec = x;
    return CUDA_SUCCESS;
}

/* May the current device (@p dev) do @p op now? Every device operand byte must be device memory
 * it may access: else the GPU faults (ILLEGAL_ADDRESS). Lock held. */
static CUresult op_check_locked(const struct emu_op *op, int dev)
{
    CUresult r = CUDA_SUCCESS;
    if (op->dst_dev)
        r = emu_dev_check_locked(op->dst, op->size, dev, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, false);
    if (r == CUDA_SUCCESS && op->src_dev)
        r = emu_dev_check_locked(op->src, op->size, dev, CU_MEM_ACCESS_FLAGS_PROT_READ, false);
    return r == CUDA_SUCCESS ? r : CUDA_ERROR_ILLEGAL_ADDRESS;
}

/* Outside the lock (devmem.c takes it per piece), as the async calls move their bytes; a host
 * operand is the captured call's host pointer. */
static CUresult op_run(const struct emu_op *op)
{
    if (!op->size)
        return CUDA_SUCCESS;
    if (op->kind == EMU_OP_MEMSET)
        return emu_dev_set(op->dst, op->value, op->size);
    if (op->dst_dev && op->src_dev)
        return emu_dev_copy(op->dst, op->src, op->size);
    if (op->dst_dev)
        return emu_dev_write(op->dst, (const void *)op->src, op->size);
    if (op->src_dev)
        return emu_dev_read((void *)op->dst, op->src, op->size);
    memmove((void *)op->dst, (const void *)op->src, op->size);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    EMU_ENTER(cuGraphLaunch);
    CUcontext ctx = emu_ctx_current();
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUgraphExec x = exec_resolve_locked(hGraphExec);
    CUstream s = emu_stream_resolve_locked(hStream);
    struct emu_op *ops = NULL;
    size_t nops = 0;
    if (!x) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (!s) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if ((r = emu_capture_refuse_locked(s)) == CUDA_SUCCESS) {
        for (size_t i = 0; i < x->nops && r == CUDA_SUCCESS; i++)
            r = op_check_locked(&x->ops[i], ctx->ordinal);
        /* A copy, so that a cuGraphExecDestroy by another thread cannot pull the ops away. */
        if (r == CUDA_SUCCESS && x->nops) {
            if ((ops = malloc(x->nops * sizeof *ops))) {
                memcpy(ops, x->ops, x->nops * sizeof *ops);
                nops = x->nops;
            } else {
                r = CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        if (r == CUDA_SUCCESS && s->held)
            s->submitted++;
    }
    emu_unlock();
    for (size_t i = 0; i < nops && r == CUDA_SUCCESS; i++)
        r = op_run(&ops[i]);
    free(ops);
    return r;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    EMU_ENTER(cuGraphExecDestroy);
    emu_lock();
    CUgraphExec x = hGraphExec ? emu_map_del(&emu.execs, (uint64_t)(uintptr_t)hGraphExec) : NULL;
    emu_unlock();
    if (!x)
        return CUDA_ERROR_INVALID_VALUE;
    free(x->ops);
    free(x);
    return CUDA_SUCCESS;
}
