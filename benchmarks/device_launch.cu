// What a GPU leg costs by each way of starting a small stage's CUDA graph when the host asks
// (issue 23: "both mechanisms deserve a measurement"): the host stores a request number into a
// word of mapped pinned memory and spins until the stage's graph stored it into a done word.
//
//   host_launch     the host calls cudaGraphLaunch per request (what a user writes)
//   stream_wait     graphs queued ahead, each behind cuStreamWaitValue64 on the request word
//                   (hostless's armed segments)
//   device_tail     a one-thread scheduler graph waits for the request, then tail-launches the
//                   stage's graph and itself (device graph launch, cudaStreamGraphTailLaunch)
//   device_ff       the scheduler fire-and-forget launches the stage's graph per request and
//                   waits for its done word; it tail-launches itself every FF_BUDGET requests
//                   (a graph may fire and forget at most 120 graphs in one execution)
//   resident        a resident block does the stage's work itself (the GPU command processor's
//                   way: no launch at all)
//
// The stage: add 1 to 16 floats in device memory, then store the request number (a system
// fence first).  Prints one JSON object.  Build: nvcc -O2 -arch=sm_90 -rdc=true
// device_launch.cu -lcudadevrt -lcuda -o device_launch (benchmarks/device_launch.py does it).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)
#define CKD(x)                                                                    \
    do {                                                                          \
        CUresult r_ = (x);                                                        \
        if (r_ != CUDA_SUCCESS) {                                                 \
            fprintf(stderr, "%s:%d %s: CUresult %d\n", __FILE__, __LINE__, #x, (int)r_); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

struct Words {  // mapped pinned memory; each word on a line of its own
    volatile unsigned long long req;
    char pad0[120];
    volatile unsigned long long done;
    char pad1[120];
    volatile unsigned long long stop;
    char pad2[120];
};

static const int N_FLOATS = 16;
static const int FF_BUDGET = 100;
static const int AHEAD = 8;

__global__ void work(float *x, int n) {
    int i = threadIdx.x;
    if (i < n) x[i] += 1.0f;
}

__global__ void signal_done(Words *w) {  // the request the host made is the one this frame serves
    unsigned long long r = w->req;
    __threadfence_system();
    w->done = r;
}

struct Sched {
    unsigned long long seen;  // the last request served (device memory)
    unsigned long long launch_errors;
};

__global__ void sched_tail(Words *w, cudaGraphExec_t stage, Sched *s) {
    unsigned long long next = s->seen + 1;
    while (w->req < next)
        if (w->stop) return;
    s->seen = next;
    if (cudaGraphLaunch(stage, cudaStreamGraphTailLaunch) != cudaSuccess) s->launch_errors++;
    if (cudaGraphLaunch(cudaGetCurrentGraphExec(), cudaStreamGraphTailLaunch) != cudaSuccess) s->launch_errors++;
}

__global__ void sched_ff(Words *w, cudaGraphExec_t stage, Sched *s) {
    for (int k = 0; k < FF_BUDGET; k++) {
        unsigned long long next = s->seen + 1;
        while (w->req < next)
            if (w->stop) return;
        s->seen = next;
        if (cudaGraphLaunch(stage, cudaStreamGraphFireAndForget) != cudaSuccess) s->launch_errors++;
        while (w->done < next)
            if (w->stop) return;
    }
    if (cudaGraphLaunch(cudaGetCurrentGraphExec(), cudaStreamGraphTailLaunch) != cudaSuccess) s->launch_errors++;
}

__global__ void resident(Words *w, float *x, int n, unsigned long long first) {
    __shared__ int stop;
    for (unsigned long long next = first;; next++) {
        if (threadIdx.x == 0) {
            stop = 0;
            while (w->req < next)
                if (w->stop) {
                    stop = 1;
                    break;
                }
        }
        __syncthreads();
        if (stop) return;
        if (threadIdx.x < n) x[threadIdx.x] += 1.0f;
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence_system();
            w->done = next;
        }
    }
}

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void report(const char *name, std::vector<double> &t, bool last, const char *extra = "") {
    std::sort(t.begin(), t.end());
    size_t n = t.size();
    printf("  \"%s\": {\"p10_us\": %.3f, \"p50_us\": %.3f, \"p90_us\": %.3f, \"min_us\": %.3f, \"n\": %zu%s}%s\n", name,
           t[n / 10], t[n / 2], t[n * 9 / 10], t[0], n, extra, last ? "" : ",");
    fflush(stdout);
}

static bool wait_done(Words *w, unsigned long long v) {
    double t0 = now_us();
    while (w->done < v)
        if (now_us() - t0 > 2e6) return false;
    return true;
}

int main(int argc, char **argv) {
    int frames = argc > 1 ? atoi(argv[1]) : 2000;
    CK(cudaSetDevice(0));
    Words *w;
    CK(cudaHostAlloc((void **)&w, sizeof(Words), cudaHostAllocMapped));
    w->req = w->done = w->stop = 0;
    Words *wd;
    CK(cudaHostGetDevicePointer((void **)&wd, w, 0));
    float *x;
    CK(cudaMalloc(&x, N_FLOATS * sizeof(float)));
    CK(cudaMemset(x, 0, N_FLOATS * sizeof(float)));
    Sched *s;
    CK(cudaMalloc(&s, sizeof(Sched)));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    // the stage's graph, instantiated for the host and for device launch
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    work<<<1, 32, 0, st>>>(x, N_FLOATS);
    signal_done<<<1, 1, 0, st>>>(wd);
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t host_exec, dev_exec;
    CK(cudaGraphInstantiate(&host_exec, g, 0));
    CK(cudaGraphInstantiateWithFlags(&dev_exec, g, cudaGraphInstantiateFlagDeviceLaunch));
    CK(cudaGraphUpload(dev_exec, st));
    CK(cudaStreamSynchronize(st));

    unsigned long long v = 0;
    std::vector<double> t;
    printf("{\n  \"frames\": %d,\n", frames);

    // host_launch
    for (int i = -50; i < frames; i++) {
        double t0 = now_us();
        w->req = ++v;
        CK(cudaGraphLaunch(host_exec, st));
        if (!wait_done(w, v)) { fprintf(stderr, "host_launch hung at %llu\n", v); return 1; }
        if (i >= 0) t.push_back(now_us() - t0);
    }
    CK(cudaStreamSynchronize(st));
    report("host_launch", t, false);

    // stream_wait: AHEAD frames queued, each behind a wait on the request word
    t.clear();
    CUdeviceptr req_d = (CUdeviceptr)&wd->req;
    unsigned long long q = v;
    auto enqueue = [&](void) {
        ++q;
        CKD(cuStreamWaitValue64((CUstream)st, req_d, q, CU_STREAM_WAIT_VALUE_GEQ));
        CK(cudaGraphLaunch(host_exec, st));
    };
    for (int k = 0; k < AHEAD; k++) enqueue();
    for (int i = -50; i < frames; i++) {
        double t0 = now_us();
        w->req = ++v;
        if (!wait_done(w, v)) { fprintf(stderr, "stream_wait hung at %llu\n", v); return 1; }
        if (i >= 0) t.push_back(now_us() - t0);
        if (i + AHEAD < frames) enqueue();
    }
    CK(cudaStreamSynchronize(st));
    report("stream_wait", t, false);

    // device_tail and device_ff: a scheduler graph launched once from the host
    const char *names[2] = {"device_tail", "device_ff"};
    for (int m = 0; m < 2; m++) {
        t.clear();
        Sched s0 = {v, 0};
        CK(cudaMemcpy(s, &s0, sizeof s0, cudaMemcpyHostToDevice));
        cudaGraph_t sg;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        if (m == 0)
            sched_tail<<<1, 1, 0, st>>>(wd, dev_exec, s);
        else
            sched_ff<<<1, 1, 0, st>>>(wd, dev_exec, s);
        CK(cudaStreamEndCapture(st, &sg));
        cudaGraphExec_t sx;
        CK(cudaGraphInstantiateWithFlags(&sx, sg, cudaGraphInstantiateFlagDeviceLaunch));
        CK(cudaGraphUpload(sx, st));
        CK(cudaStreamSynchronize(st));
        w->stop = 0;
        CK(cudaGraphLaunch(sx, st));
        bool ok = true;
        for (int i = -50; i < frames && ok; i++) {
            double t0 = now_us();
            w->req = ++v;
            if (!wait_done(w, v)) {
                fprintf(stderr, "%s hung at %llu\n", names[m], v);
                ok = false;
            } else if (i >= 0) {
                t.push_back(now_us() - t0);
            }
        }
        w->stop = 1;
        cudaError_t e = cudaStreamSynchronize(st);
        Sched s1;
        CK(cudaMemcpy(&s1, s, sizeof s1, cudaMemcpyDeviceToHost));
        char extra[160];
        snprintf(extra, sizeof extra, ", \"launch_errors\": %llu, \"sync\": \"%s\", \"ok\": %s", s1.launch_errors,
                 cudaGetErrorString(e), ok ? "true" : "false");
        if (t.empty()) t.push_back(-1);
        report(names[m], t, false, extra);
        CK(cudaGraphExecDestroy(sx));
        CK(cudaGraphDestroy(sg));
    }

    // resident
    t.clear();
    w->stop = 0;
    resident<<<1, 32, 0, st>>>(wd, x, N_FLOATS, v + 1);
    for (int i = -50; i < frames; i++) {
        double t0 = now_us();
        w->req = ++v;
        if (!wait_done(w, v)) { fprintf(stderr, "resident hung at %llu\n", v); return 1; }
        if (i >= 0) t.push_back(now_us() - t0);
    }
    w->stop = 1;
    CK(cudaStreamSynchronize(st));
    report("resident", t, false);

    float h[N_FLOATS];
    CK(cudaMemcpy(h, x, sizeof h, cudaMemcpyDeviceToHost));
    // every frame of every mode added 1: the host checks the count
    printf("  \"x0\": %.1f, \"requests\": %llu\n}\n", h[0], v);
    return 0;
}
