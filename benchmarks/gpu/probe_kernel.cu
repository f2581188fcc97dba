// The probe kernel of device_probe.py (host-located VMM memory read and written by a kernel),
// for nvcc -ptx where the driver's JIT refuses device_probe.py's own PTX: p[i] += 1 for i < n.
extern "C" __global__ void xseg_probe_inc(unsigned int *p, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] += 1;
}
