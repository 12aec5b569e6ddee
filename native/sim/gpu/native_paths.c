/* Native launch paths: C call chains that end in a kernel launch, so the agent's stacks show native frames below
 * gpusim_launch as they would below cudaLaunchKernel in a C++ framework.
 *
 * Each function is noinline and noipa (no clones renamed .constprop/.isra, no merging of identical bodies), the
 * library is built with frame pointers and -fno-optimize-sibling-calls, and the empty asm after each call keeps the
 * call from being the function's last act: every frame stays on the stack under the launch.
 */
#include "gpusim.h"

#define NATIVE_FN __attribute__((noinline, noipa, visibility("hidden")))
#define KEEP_FRAME() __asm__ __volatile__("" ::: "memory")

/* native_gemm(const float *, const float *, float *, int) and native_gemm_bwd(...), as a C++ compiler names them */
#define GEMM_KERNEL "_Z11native_gemmPKfS0_Pfi"
#define GEMM_BWD_KERNEL "_Z15native_gemm_bwdPKfS0_Pfi"
#define GEMM_NS 200000u
#define GEMM_BWD_NS 400000u

static const struct gpusim_kernel_spec native_kernels[] = {
    {"gpusim_native_train_step;native_forward;native_gemm", GEMM_KERNEL, GEMM_NS, 0},
    {"gpusim_native_train_step;native_backward;native_gemm_bwd", GEMM_BWD_KERNEL, GEMM_BWD_NS, 0},
};

NATIVE_FN void native_gemm(void)
{
    gpusim_launch(GEMM_KERNEL, GEMM_NS, 0);
    KEEP_FRAME();
}

NATIVE_FN void native_forward(void)
{
    native_gemm();
    KEEP_FRAME();
}

NATIVE_FN void native_gemm_bwd(void)
{
    gpusim_launch(GEMM_BWD_KERNEL, GEMM_BWD_NS, 0);
    KEEP_FRAME();
}

NATIVE_FN void native_backward(void)
{
    native_gemm_bwd();
    KEEP_FRAME();
}

void gpusim_native_train_step(int steps)
{
    for (int i = 0; i < steps; i++) {
        native_forward();
        native_backward();
    }
    KEEP_FRAME();
}

uint32_t gpusim_native_kernels(const struct gpusim_kernel_spec **out)
{
    *out = native_kernels;
    return sizeof(native_kernels) / sizeof(native_kernels[0]);
}
