/* What the simulated libcupti's files share (simulated_cupti.c: the CUPTI entry points and buffers;
 * simulated_records.c: the records' layouts; simulated_workloads.c: the API calls a test plays and the loops of
 * them). Not exported. */
#ifndef SIMULATED_CUPTI_H
#define SIMULATED_CUPTI_H

#include <cupti.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_API __attribute__((visibility("default")))

struct sim_record {
    CUpti_ActivityKind kind;
    const char *name; /* kernels */
    uint64_t bytes;   /* copies and sets */
    uint8_t copy_kind, src_kind, dst_kind;
    uint32_t device, src_device, dst_device; /* peer copies (MEMCPY2): where it runs, from, to */
    uint32_t graph_id;
    uint64_t graph_node_id;
};

void simcupti_spin(uint64_t ns);
uint32_t simcupti_next_correlation_id(void);
/* the subscriber's callback if enabled; at the enter site also the time a launch API spends before submitting */
void simcupti_api_call(CUpti_CallbackDomain domain, uint32_t cbid, CUpti_ApiCallbackSite site, const char *api,
                       uint32_t correlation_id, int *result);
int simcupti_kind_on(CUpti_ActivityKind kind);
size_t simcupti_record_size(CUpti_ActivityKind kind);
/* Writes one record of r->kind into `room` (simcupti_record_size bytes, zeroed); `name` is a kernel's kept name. */
void simcupti_fill_record(void *room, const struct sim_record *r, const char *name, uint32_t correlation_id,
                          uint64_t start, uint64_t end, uint32_t stream);
uint64_t simcupti_now_ns(void);
void simcupti_write_records(const struct sim_record *records, uint32_t count, uint32_t correlation_id, uint64_t *t,
                            uint64_t duration_ns, uint32_t stream);
SIM_API uint32_t simcupti_launch(uint32_t driver, uint32_t cbid, const char *api, const char *kernel, uint32_t kernels,
                                 uint64_t duration_ns, uint32_t stream, int nested_driver, int fail);

#endif
