// The host cost of one cuDNN convolution three ways (see cudnn_conv_host.py): at::convolution, as AOTInductor's
// generated code calls it; at::cudnn_convolution, past ATen's backend selection; and cuDNN's backend API with the
// execution plan built once, as a wrapper that kept a plan per call site would run it.
#include <ATen/ATen.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAStream.h>
#include <cudnn.h>
#include <torch/extension.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#define CHECK_CUDNN(x)                                                                                   \
    do {                                                                                                 \
        cudnnStatus_t s_ = (x);                                                                          \
        if (s_ != CUDNN_STATUS_SUCCESS) throw std::runtime_error(std::string(#x) + ": " + cudnnGetErrorString(s_)); \
    } while (0)

struct Desc {
    cudnnBackendDescriptor_t d = nullptr;
    Desc() = default;
    explicit Desc(cudnnBackendDescriptorType_t t) { CHECK_CUDNN(cudnnBackendCreateDescriptor(t, &d)); }
    ~Desc() { if (d) cudnnBackendDestroyDescriptor(d); }
    Desc(Desc&& o) noexcept : d(o.d) { o.d = nullptr; }
    Desc& operator=(Desc&& o) noexcept { std::swap(d, o.d); return *this; }
    Desc(const Desc&) = delete;
    void set(cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t c, const void* v) {
        CHECK_CUDNN(cudnnBackendSetAttribute(d, n, t, c, v));
    }
    void finalize() { CHECK_CUDNN(cudnnBackendFinalize(d)); }
};

static cudnnDataType_t dtype_of(at::ScalarType t) {
    switch (t) {
        case at::kFloat: return CUDNN_DATA_FLOAT;
        case at::kHalf: return CUDNN_DATA_HALF;
        case at::kBFloat16: return CUDNN_DATA_BFLOAT16;
        default: throw std::runtime_error("dtype");
    }
}

static int64_t alignment(const void* p) {
    auto a = reinterpret_cast<uintptr_t>(p);
    int64_t al = 1;
    for (; al < 16; al *= 2) if (a % (al * 2)) return al;
    return al;
}

static Desc tensor_desc(const at::Tensor& t, int64_t uid) {
    Desc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    cudnnDataType_t dt = dtype_of(t.scalar_type());
    std::vector<int64_t> dims(t.sizes().begin(), t.sizes().end()), strides(t.strides().begin(), t.strides().end());
    int64_t al = alignment(t.data_ptr());
    d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.size(), dims.data());
    d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.size(), strides.data());
    d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &al);
    d.finalize();
    return d;
}

struct Plan {
    Desc plan;
    int64_t workspace = 0;
};

static Plan make_plan(const at::Tensor& x, const at::Tensor& w, const at::Tensor& y, std::vector<int64_t> stride,
                      std::vector<int64_t> pad, std::vector<int64_t> dil, bool allow_tf32) {
    cudnnHandle_t handle = at::native::getCudnnHandle();
    Desc xd = tensor_desc(x, 'x'), wd = tensor_desc(w, 'w'), yd = tensor_desc(y, 'y');
    Desc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    int64_t nsp = stride.size();
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &nsp);
    conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, nsp, dil.data());
    conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, nsp, stride.data());
    conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, nsp, pad.data());
    conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, nsp, pad.data());
    conv.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    float alpha = 1.f, beta = 0.f;
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &xd.d);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &wd.d);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &yd.d);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv.d);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    op.finalize();
    Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op.d);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    graph.finalize();
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t hmode = CUDNN_HEUR_MODE_A;
    heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph.d);
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hmode);
    heur.finalize();
    int64_t count = 0;
    CHECK_CUDNN(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    std::vector<Desc> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) { cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR); raw.push_back(cfgs.back().d); }
    CHECK_CUDNN(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, raw.data()));
    for (int64_t i = 0; i < count; ++i) {
        Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        int64_t n = 0;
        CHECK_CUDNN(cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine.d));
        cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        int64_t nn = 0;
        CHECK_CUDNN(cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes));
        bool skip = false;
        for (int64_t k = 0; k < nn; ++k) {
            if (notes[k] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) skip = true;
            if (!allow_tf32 && x.scalar_type() == at::kFloat && notes[k] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE) skip = true;
        }
        if (skip) continue;
        Plan p{Desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR), 0};
        p.plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
        p.plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw[i]);
        if (cudnnBackendFinalize(p.plan.d) != CUDNN_STATUS_SUCCESS) continue;
        CHECK_CUDNN(cudnnBackendGetAttribute(p.plan.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &p.workspace));
        return p;
    }
    throw std::runtime_error("no plan");
}

static void execute(const Plan& p, const at::Tensor& x, const at::Tensor& w, const at::Tensor& y) {
    cudnnHandle_t handle = at::native::getCudnnHandle();
    at::Tensor ws;
    void* wsp = nullptr;
    if (p.workspace) { ws = at::empty({p.workspace}, x.options().dtype(at::kByte)); wsp = ws.data_ptr(); }
    void* ptrs[3] = {x.data_ptr(), w.data_ptr(), y.data_ptr()};
    int64_t uids[3] = {'x', 'w', 'y'};
    Desc vp(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    vp.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
    vp.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
    vp.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wsp);
    vp.finalize();
    CHECK_CUDNN(cudnnBackendExecute(handle, p.plan.d, vp.d));
}

static std::vector<int64_t> vec(at::IntArrayRef a) { return {a.begin(), a.end()}; }

// mode 0: at::convolution, 1: at::cudnn_convolution, 2: cuDNN's backend API, the plan made once.
// Returns µs per call to enqueue, µs per call until the GPU is done, and the max abs difference to at::convolution.
std::vector<double> bench(at::Tensor x, at::Tensor w, std::vector<int64_t> stride, std::vector<int64_t> pad,
                          std::vector<int64_t> dil, int64_t groups, int64_t mode, int64_t iters) {
    at::Tensor ref = at::convolution(x, w, {}, stride, pad, dil, false, {0, 0}, groups);
    at::Tensor y = at::empty_like(ref);
    Plan plan;
    if (mode == 2) plan = make_plan(x, w, y, stride, pad, dil, true);
    auto one = [&]() {
        if (mode == 0) return at::convolution(x, w, {}, stride, pad, dil, false, {0, 0}, groups);
        if (mode == 1) return at::cudnn_convolution(x, w, pad, stride, dil, groups, false, false, true);
        at::Tensor out = at::empty_like(ref);
        execute(plan, x, w, out);
        return out;
    };
    for (int i = 0; i < 20; ++i) one();
    cudaDeviceSynchronize();
    auto t0 = std::chrono::steady_clock::now();
    at::Tensor last;
    for (int64_t i = 0; i < iters; ++i) last = one();
    auto t1 = std::chrono::steady_clock::now();
    cudaDeviceSynchronize();
    auto t2 = std::chrono::steady_clock::now();
    double err = (last.to(at::kFloat) - ref.to(at::kFloat)).abs().max().item<double>();
    return {std::chrono::duration<double, std::micro>(t1 - t0).count() / iters,
            std::chrono::duration<double, std::micro>(t2 - t0).count() / iters, err};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("bench", &bench); }
