/* The activity records the simulated libcupti (simulated_cupti.c, same library) writes into a buffer, each kind as
 * its CUDA 12 type: CUpti_ActivityKernel9, CUpti_ActivityMemcpy6, CUpti_ActivityMemset4 and, for peer-to-peer
 * copies between two devices, CUpti_ActivityMemcpyPtoP4 (MEMCPY2). Simulated: the fields a tool reads, the rest 0. */
#include "simulated_cupti.h"

size_t simcupti_record_size(CUpti_ActivityKind kind)
{
    if (kind == CUPTI_ACTIVITY_KIND_MEMCPY)
        return sizeof(CUpti_ActivityMemcpy6);
    if (kind == CUPTI_ACTIVITY_KIND_MEMSET)
        return sizeof(CUpti_ActivityMemset4);
    if (kind == CUPTI_ACTIVITY_KIND_MEMCPY2)
        return sizeof(CUpti_ActivityMemcpyPtoP4);
    return sizeof(CUpti_ActivityKernel9);
}

void simcupti_fill_record(void *room, const struct sim_record *r, const char *name, uint32_t correlation_id,
                          uint64_t start, uint64_t end, uint32_t stream)
{
    if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        CUpti_ActivityMemcpy6 *m = room;
        *m = (CUpti_ActivityMemcpy6){.kind = r->kind, .copyKind = r->copy_kind, .srcKind = r->src_kind,
                                     .dstKind = r->dst_kind, .bytes = r->bytes, .start = start, .end = end,
                                     .streamId = stream, .correlationId = correlation_id,
                                     .graphNodeId = r->graph_node_id, .graphId = r->graph_id};
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY2) {
        CUpti_ActivityMemcpyPtoP4 *m = room;
        *m = (CUpti_ActivityMemcpyPtoP4){.kind = r->kind, .copyKind = r->copy_kind, .srcKind = r->src_kind,
                                         .dstKind = r->dst_kind, .bytes = r->bytes, .start = start, .end = end,
                                         .deviceId = r->device, .streamId = stream, .srcDeviceId = r->src_device,
                                         .dstDeviceId = r->dst_device, .correlationId = correlation_id,
                                         .graphNodeId = r->graph_node_id, .graphId = r->graph_id};
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        CUpti_ActivityMemset4 *m = room;
        *m = (CUpti_ActivityMemset4){.kind = r->kind, .bytes = r->bytes, .start = start, .end = end,
                                     .streamId = stream, .correlationId = correlation_id,
                                     .memoryKind = r->dst_kind, .graphNodeId = r->graph_node_id,
                                     .graphId = r->graph_id};
    } else {
        CUpti_ActivityKernel9 *k = room;
        k->kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
        k->start = start;
        k->end = end;
        k->deviceId = 0;
        k->streamId = stream;
        k->correlationId = correlation_id;
        k->name = name;
        k->graphId = r->graph_id;
        k->graphNodeId = r->graph_node_id;
    }
}
