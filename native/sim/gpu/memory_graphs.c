/* The simulator's copies, sets and CUDA graphs (simulated): a copy or set is launched like a kernel, under the launch
 * rate limit and with its own API name, and its record is labelled as the agent labels CUPTI's ("[memcpy HtoD]",
 * "[memset]"); a graph is a fixed list of nodes, created once and launched many times, each launch one correlation id
 * for all the nodes it replays (see gpusim.h).
 */
#include "fleetprof_probes.h"
#include "gpusim.h"
#include "gpusim_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

struct graph {
    uint32_t count;
    struct gpusim_work nodes[GPUSIM_GRAPH_MAX_NODES];
    char names[GPUSIM_GRAPH_MAX_NODES][GPUSIM_NAME_MAX];
};

static struct graph graphs[GPUSIM_MAX_GRAPHS];
static _Atomic uint32_t graph_count;
static pthread_mutex_t graph_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *copy_label(uint32_t memory_kind)
{
    static const char *const labels[] = {"[memcpy unknown]", "[memcpy HtoD]", "[memcpy DtoH]", "[memcpy HtoA]",
                                         "[memcpy AtoH]", "[memcpy AtoA]", "[memcpy AtoD]", "[memcpy DtoA]",
                                         "[memcpy DtoD]", "[memcpy HtoH]", "[memcpy PtoP]"};
    if (memory_kind & FLEETPROF_MEMORY_IS_SET)
        return "[memset]";
    uint32_t copy = memory_kind & 0xff;
    return labels[copy < sizeof(labels) / sizeof(labels[0]) ? copy : 0];
}

GPUSIM_API uint32_t gpusim_memcpy(uint64_t bytes, uint32_t copy_kind, uint32_t src_kind, uint32_t dst_kind,
                                  uint64_t duration_ns, uint32_t stream)
{
    uint32_t kind = FLEETPROF_MEMORY_KIND(copy_kind, 0, src_kind, dst_kind);
    struct gpusim_work w = {.name = copy_label(kind), .duration_ns = duration_ns, .bytes = bytes, .activity = GPUSIM_MEMCPY,
                     .memory_kind = kind};
    return gpusim_submit(&w, 1, stream, GPUSIM_API_MEMCPY);
}

GPUSIM_API uint32_t gpusim_memset(uint64_t bytes, uint32_t dst_kind, uint64_t duration_ns, uint32_t stream)
{
    uint32_t kind = FLEETPROF_MEMORY_KIND(0, 1, 0, dst_kind);
    struct gpusim_work w = {.name = "[memset]", .duration_ns = duration_ns, .bytes = bytes, .activity = GPUSIM_MEMSET,
                     .memory_kind = kind};
    return gpusim_submit(&w, 1, stream, GPUSIM_API_MEMSET);
}

GPUSIM_API uint32_t gpusim_graph_create(const struct gpusim_graph_node *nodes, uint32_t count)
{
    if (count == 0 || count > GPUSIM_GRAPH_MAX_NODES || nodes == NULL)
        return 0;
    pthread_mutex_lock(&graph_mu);
    uint32_t id = atomic_load(&graph_count) + 1;
    if (id > GPUSIM_MAX_GRAPHS) {
        pthread_mutex_unlock(&graph_mu);
        return 0;
    }
    struct graph *g = &graphs[id - 1];
    g->count = count;
    for (uint32_t i = 0; i < count; i++) {
        struct gpusim_work *w = &g->nodes[i];
        uint32_t kind = nodes[i].memory_kind;
        w->duration_ns = nodes[i].duration_ns;
        w->graph_id = id;
        w->graph_node_id = ((uint64_t)id << 32) | (i + 1);
        if (kind) {
            w->activity = kind & FLEETPROF_MEMORY_IS_SET ? GPUSIM_MEMSET : GPUSIM_MEMCPY;
            w->memory_kind = kind;
            w->bytes = nodes[i].bytes;
            snprintf(g->names[i], GPUSIM_NAME_MAX, "%s", copy_label(kind));
        } else {
            w->activity = GPUSIM_KERNEL;
            w->memory_kind = 0;
            w->bytes = 0;
            snprintf(g->names[i], GPUSIM_NAME_MAX, "%s", nodes[i].kernel_name ? nodes[i].kernel_name : "");
        }
        w->name = g->names[i];
    }
    atomic_store(&graph_count, id); /* published whole: launches read it without the lock */
    pthread_mutex_unlock(&graph_mu);
    return id;
}

GPUSIM_API uint32_t gpusim_graph_launch(uint32_t graph_id, uint32_t stream)
{
    if (graph_id == 0 || graph_id > atomic_load(&graph_count))
        return 0;
    const struct graph *g = &graphs[graph_id - 1];
    return gpusim_submit(g->nodes, g->count, stream, GPUSIM_API_GRAPH);
}
