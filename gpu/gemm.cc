// Gemm through cuBLASLt. Row-major to column-major mapping (cuBLASLt is column-major):
//   y[M,N] row-major (ld ldy) is y^T[N,M] column-major (ld ldy): D, N rows x M cols.
//   W[N,K] row-major (ld ldw) is W^T[K,N] column-major: A = K x N, op(A) = transpose -> N x K.
//   x[M,K] row-major (ld ldx) is x^T[K,M] column-major: B = K x M, op(B) = none.
//   D = op(A) op(B) = W x^T = (x W^T)^T = y^T. The bias (length = rows of D = N) is per feature.
// This is the "TN" layout, the one every cuBLASLt kernel family supports.
#include "gpu/gemm.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>

#include "base/check.h"
#include "gpu/runtime.h"

namespace troupe::gpu {
namespace {

// cuBLASLt is loaded on first use (dlopen), not linked: its static initialization ran in every
// process that linked it, GPU or not -- ~0.45 s of each `troupe` command's start on the 2-core VM
// (84 % of a `perf record` of `troupe --help`), and of every test process of the CLI and actors.
// The *Init functions of cublasLt.h are inline wrappers of the *_internal entry points.
struct LtApi {
  decltype(&::cublasLtCreate) create = nullptr;
  decltype(&::cublasLtDestroy) destroy = nullptr;
  decltype(&::cublasLtGetStatusName) status_name = nullptr;
  decltype(&::cublasLtGetStatusString) status_string = nullptr;
  decltype(&::cublasLtMatmul) matmul = nullptr;
  decltype(&::cublasLtMatmulAlgoCheck) algo_check = nullptr;
  decltype(&::cublasLtMatmulAlgoConfigGetAttribute) algo_config_get = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&::cublasLtMatmulDescInit_internal) desc_init = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&::cublasLtMatmulPreferenceInit_internal) pref_init = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&::cublasLtMatrixLayoutInit_internal) layout_init = nullptr;
  std::string error;  // why it could not be loaded ("" when loaded)
};

LtApi load_cublaslt() {
  LtApi a;
  // The toolkit's soname first (LD_LIBRARY_PATH, ld.so.cache, this program's run path), then the
  // library the build found.
  void* h = nullptr;
  std::string tried;
  for (const char* name : {TROUPE_CUBLASLT_SONAME, TROUPE_CUBLASLT_PATH}) {
    h = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h) break;
    const char* e = ::dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (e ? e : name);
  }
  if (!h) {
    a.error = "cannot load cuBLASLt: " + tried;
    return a;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
    if (!fn && a.error.empty()) a.error = std::string("cuBLASLt has no ") + name;
  };
  sym(a.create, "cublasLtCreate");
  sym(a.destroy, "cublasLtDestroy");
  sym(a.status_name, "cublasLtGetStatusName");
  sym(a.status_string, "cublasLtGetStatusString");
  sym(a.matmul, "cublasLtMatmul");
  sym(a.algo_check, "cublasLtMatmulAlgoCheck");
  sym(a.algo_config_get, "cublasLtMatmulAlgoConfigGetAttribute");
  sym(a.heuristic, "cublasLtMatmulAlgoGetHeuristic");
  sym(a.desc_init, "cublasLtMatmulDescInit_internal");
  sym(a.desc_set, "cublasLtMatmulDescSetAttribute");
  sym(a.pref_init, "cublasLtMatmulPreferenceInit_internal");
  sym(a.pref_set, "cublasLtMatmulPreferenceSetAttribute");
  sym(a.layout_init, "cublasLtMatrixLayoutInit_internal");
  return a;  // the library stays loaded for the life of the process
}

/// The loaded API; only a Gemm calls this, after its constructor checked `error` is empty.
const LtApi& lt() {
  static const LtApi api = load_cublaslt();
  return api;
}

const char* out_name(GemmOut t) { return t == GemmOut::kF32 ? "f32" : "bf16"; }
size_t out_size(GemmOut t) { return t == GemmOut::kF32 ? 4 : 2; }
cudaDataType_t out_cuda_type(GemmOut t) { return t == GemmOut::kF32 ? CUDA_R_32F : CUDA_R_16BF; }

std::string shape_of(const GemmArgs& a) {
  return strfmt("m=%lld n=%lld k=%lld ldx=%lld ldw=%lld ldy=%lld out=%s bias=%d accumulate=%d",
                static_cast<long long>(a.m), static_cast<long long>(a.n),
                static_cast<long long>(a.k), static_cast<long long>(a.ldx),
                static_cast<long long>(a.ldw), static_cast<long long>(a.ldy), out_name(a.y_type),
                a.bias != nullptr, a.accumulate);
}

/// Throws DeviceError(kCublas) naming the call, the status and the problem.
void lt_check(cublasStatus_t st, const char* call, const GemmArgs& a) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  throw DeviceError(Errc::kCublas, strfmt("%s failed: %s (%s) [%s]", call, lt().status_name(st),
                                          lt().status_string(st), shape_of(a).c_str()));
}

/// Largest of 16, 8, 4, 2 (not below the element size) dividing a row stride in bytes: with
/// 16-byte aligned base pointers this is the alignment every row start has.
uint32_t row_alignment(int64_t ld, size_t elem_bytes) {
  const uint64_t bytes = static_cast<uint64_t>(ld) * elem_bytes;
  uint32_t al = 16;
  while (al > elem_bytes && bytes % al != 0) al /= 2;
  return al;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// The normalized arguments: leading dimensions resolved (0 = dense).
GemmArgs resolved(const GemmArgs& in) {
  GemmArgs a = in;
  if (a.ldx == 0) a.ldx = a.k;
  if (a.ldw == 0) a.ldw = a.k;
  if (a.ldy == 0) a.ldy = a.n;
  return a;
}

/// Everything the pinned algorithm depends on; M is deliberately absent (batch invariance).
struct Key {
  int64_t n = 0, k = 0;
  GemmOut y_type = GemmOut::kF32;
  bool bias = false, accumulate = false;
  uint32_t align_x = 0, align_w = 0, align_y = 0;  // bytes, see row_alignment
  auto tie() const { return std::tie(n, k, y_type, bias, accumulate, align_x, align_w, align_y); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Entry {
  cublasLtMatmulDescOpaque_t desc{};  // initialized in place (never copied after init)
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;
  std::string info;  // for debug_string
};

/// Column-major layouts of one call (see the file comment); initialized in place.
struct Layouts {
  cublasLtMatrixLayoutOpaque_t a{}, b{}, d{};
  Layouts(const GemmArgs& g, int64_t m) {
    lt_check(lt().layout_init(&a, sizeof(a), CUDA_R_16BF, static_cast<uint64_t>(g.k),
                              static_cast<uint64_t>(g.n), g.ldw),
             "cublasLtMatrixLayoutInit(A = W)", g);
    lt_check(lt().layout_init(&b, sizeof(b), CUDA_R_16BF, static_cast<uint64_t>(g.k),
                              static_cast<uint64_t>(m), g.ldx),
             "cublasLtMatrixLayoutInit(B = x)", g);
    lt_check(lt().layout_init(&d, sizeof(d), out_cuda_type(g.y_type), static_cast<uint64_t>(g.n),
                              static_cast<uint64_t>(m), g.ldy),
             "cublasLtMatrixLayoutInit(C = D = y)", g);
  }
};

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value,
              const char* what, const GemmArgs& a) {
  lt_check(lt().desc_set(desc, attr, &value, sizeof(value)), what, a);
}

template <class T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              const T& value, const char* what, const GemmArgs& a) {
  lt_check(lt().pref_set(pref, attr, &value, sizeof(value)), what, a);
}

/// An algorithm config attribute for the debug string, or -1 where cuBLASLt does not report it
/// (informational only: a failure here must not fail a GEMM).
template <class T>
long long config_or(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (lt().algo_config_get(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS ||
      written != sizeof(v))
    return -1;
  return static_cast<long long>(v);
}

}  // namespace

std::string cublaslt_load_error() { return lt().error; }

void validate_gemm_args(const GemmArgs& in) {
  const GemmArgs a = resolved(in);
  if (a.m < 0 || a.n < 1 || a.k < 1)
    TROUPE_INPUT_ERROR("Gemm: need m >= 0, n >= 1, k >= 1, got m=%lld n=%lld k=%lld",
                       static_cast<long long>(a.m), static_cast<long long>(a.n),
                       static_cast<long long>(a.k));
  if (a.ldx < a.k || a.ldw < a.k || a.ldy < a.n)
    TROUPE_INPUT_ERROR(
        "Gemm: leading dimensions too small: need ldx >= k, ldw >= k, ldy >= n, got ldx=%lld "
        "ldw=%lld ldy=%lld for n=%lld k=%lld",
        static_cast<long long>(a.ldx), static_cast<long long>(a.ldw), static_cast<long long>(a.ldy),
        static_cast<long long>(a.n), static_cast<long long>(a.k));
  if (a.y_type != GemmOut::kF32 && a.y_type != GemmOut::kBf16)
    TROUPE_INPUT_ERROR("Gemm: unknown output type %d", static_cast<int>(a.y_type));
  if (!a.x || !a.w || !a.y)
    TROUPE_INPUT_ERROR("Gemm: null pointer (x=%p w=%p y=%p) [%s]", static_cast<const void*>(a.x),
                       static_cast<const void*>(a.w), a.y, shape_of(a).c_str());
  const struct {
    const void* p;
    const char* name;
  } ptrs[] = {{a.x, "x"}, {a.w, "w"}, {a.y, "y"}, {a.bias, "bias"}};
  for (const auto& q : ptrs)
    if (q.p && !aligned16(q.p))
      TROUPE_INPUT_ERROR("Gemm: %s must be 16-byte aligned, its address is %p [%s]", q.name, q.p,
                         shape_of(a).c_str());
  if (a.accumulate && a.y_type != GemmOut::kF32)
    TROUPE_INPUT_ERROR("Gemm: accumulate (y += x W^T) needs an f32 output, got %s [%s]",
                       out_name(a.y_type), shape_of(a).c_str());
}

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  GemmOptions opts;
  std::map<Key, Entry> cache;

  Entry& entry_for(const Key& key, const GemmArgs& a);
};

Gemm::Gemm(void* workspace, size_t workspace_bytes, GemmOptions opts)
    : impl_(std::make_unique<Impl>()) {
  if (workspace_bytes > 0 && (!workspace || reinterpret_cast<uintptr_t>(workspace) % 256 != 0))
    TROUPE_INPUT_ERROR("Gemm: the workspace must be non-null and 256-byte aligned (got %p, %zu B)",
                       workspace, workspace_bytes);
  if (opts.m_hint < 1)
    TROUPE_INPUT_ERROR("Gemm: m_hint must be >= 1, got %lld", static_cast<long long>(opts.m_hint));
  impl_->workspace = workspace_bytes ? workspace : nullptr;
  impl_->workspace_bytes = workspace_bytes;
  impl_->opts = opts;
  if (!lt().error.empty()) throw DeviceError(Errc::kCublas, lt().error);
  const cublasStatus_t st = lt().create(&impl_->handle);
  if (st != CUBLAS_STATUS_SUCCESS)
    throw DeviceError(Errc::kCublas, strfmt("cublasLtCreate failed: %s (%s)", lt().status_name(st),
                                            lt().status_string(st)));
}

Gemm::~Gemm() {
  if (impl_ && impl_->handle) lt().destroy(impl_->handle);
}

Entry& Gemm::Impl::entry_for(const Key& key, const GemmArgs& a) {
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  // The descriptor is initialized in place inside the map node (nodes never move).
  const auto it = cache.try_emplace(key).first;
  Entry& en = it->second;
  try {
    cublasLtMatmulDesc_t desc = &en.desc;
    lt_check(lt().desc_init(desc, sizeof(*desc), CUBLAS_COMPUTE_32F, CUDA_R_32F),
             "cublasLtMatmulDescInit", a);
    set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t{CUBLAS_OP_T}, "set TRANSA", a);
    set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t{CUBLAS_OP_N}, "set TRANSB", a);
    const uint32_t epilogue = key.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, "set EPILOGUE", a);
    if (key.bias) {
      set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
               static_cast<int32_t>(out_cuda_type(key.y_type)), "set BIAS_DATA_TYPE", a);
      set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias, "set BIAS_POINTER", a);
    }

    cublasLtMatmulPreferenceOpaque_t pref_storage{};
    cublasLtMatmulPreference_t pref = &pref_storage;
    lt_check(lt().pref_init(pref, sizeof(*pref)), "cublasLtMatmulPreferenceInit", a);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{workspace_bytes},
             "set MAX_WORKSPACE_BYTES", a);
    // Batch invariance: no split-K of any kind (each dot product is one sequence).
    set_pref(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
             uint32_t{CUBLASLT_REDUCTION_SCHEME_NONE}, "set REDUCTION_SCHEME_MASK", a);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_w, "set MIN_ALIGNMENT_A",
             a);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_x, "set MIN_ALIGNMENT_B",
             a);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_y, "set MIN_ALIGNMENT_C",
             a);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_y, "set MIN_ALIGNMENT_D",
             a);

    Layouts at_hint(a, opts.m_hint);
    constexpr int kWanted = 16;
    cublasLtMatmulHeuristicResult_t results[kWanted] = {};
    int found = 0;
    lt_check(lt().heuristic(handle, desc, &at_hint.a, &at_hint.b, &at_hint.d, &at_hint.d, pref,
                            kWanted, results, &found),
             "cublasLtMatmulAlgoGetHeuristic", a);
    Layouts at_one(a, 1);
    int picked = -1;
    std::string rejected;
    for (int i = 0; i < found && picked < 0; ++i) {
      const cublasLtMatmulHeuristicResult_t& r = results[i];
      if (r.state != CUBLAS_STATUS_SUCCESS) continue;
      int32_t splitk = 0;
      size_t written = 0;
      lt_check(lt().algo_config_get(&r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                    sizeof(splitk), &written),
               "cublasLtMatmulAlgoConfigGetAttribute(SPLITK_NUM)", a);
      if (splitk > 1) {
        rejected += strfmt(" #%d:splitk=%d", i, splitk);
        continue;
      }
      // The pinned algorithm must also run at M = 1 (decode) within the workspace.
      cublasLtMatmulHeuristicResult_t check{};
      const cublasStatus_t st = lt().algo_check(handle, desc, &at_one.a, &at_one.b, &at_one.d,
                                                &at_one.d, &r.algo, &check);
      if (st != CUBLAS_STATUS_SUCCESS || check.workspaceSize > workspace_bytes ||
          r.workspaceSize > workspace_bytes) {
        rejected += strfmt(" #%d:check=%s", i, lt().status_name(st));
        continue;
      }
      picked = i;
    }
    if (picked < 0)
      throw DeviceError(Errc::kCublas,
                        strfmt("cublasLtMatmulAlgoGetHeuristic: no split-K-free algorithm that "
                               "also runs at M=1 among %d candidates (m_hint=%lld, workspace %zu "
                               "B; rejected:%s) [%s]",
                               found, static_cast<long long>(opts.m_hint), workspace_bytes,
                               rejected.c_str(), shape_of(a).c_str()));
    const cublasLtMatmulHeuristicResult_t& r = results[picked];
    en.algo = r.algo;
    en.workspace_bytes = r.workspaceSize;
    en.info = strfmt(
        "n=%lld k=%lld out=%s bias=%d acc=%d align(x,w,y)=%u,%u,%u: algo=%lld tile=%lld "
        "stages=%lld splitk=%lld reduction=%lld swizzle=%lld custom=%lld inner=%lld cluster=%lld "
        "ws=%zu waves=%.2f (candidate %d of %d, m_hint=%lld)",
        static_cast<long long>(key.n), static_cast<long long>(key.k), out_name(key.y_type),
        key.bias, key.accumulate, key.align_x, key.align_w, key.align_y,
        config_or<int32_t>(r.algo, CUBLASLT_ALGO_CONFIG_ID),
        config_or<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
        config_or<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
        config_or<int32_t>(r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
        config_or<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
        config_or<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
        config_or<uint32_t>(r.algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
        config_or<uint16_t>(r.algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
        config_or<uint16_t>(r.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), r.workspaceSize,
        static_cast<double>(r.wavesCount), picked + 1, found, static_cast<long long>(opts.m_hint));
  } catch (...) {
    cache.erase(it);  // no half-initialized entry stays behind
    throw;
  }
  return en;
}

void Gemm::run(const GemmArgs& in, cudaStream_t stream) {
  validate_gemm_args(in);
  const GemmArgs a = resolved(in);
  if (a.m == 0) return;
  Key key;
  key.n = a.n;
  key.k = a.k;
  key.y_type = a.y_type;
  key.bias = a.bias != nullptr;
  key.accumulate = a.accumulate;
  key.align_x = row_alignment(a.ldx, 2);
  key.align_w = row_alignment(a.ldw, 2);
  key.align_y = row_alignment(a.ldy, out_size(a.y_type));
  Entry& en = impl_->entry_for(key, a);
  cublasLtMatmulDesc_t desc = &en.desc;
  if (key.bias) set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias, "set BIAS_POINTER", a);
  Layouts l(a, a.m);
  const float alpha = 1.0f;
  const float beta = a.accumulate ? 1.0f : 0.0f;
  // C = D = y: with beta = 0 C is not read; with beta = 1 the add is in place (same layout).
  lt_check(lt().matmul(impl_->handle, desc, &alpha, a.w, &l.a, a.x, &l.b, &beta, a.y, &l.d, a.y,
                       &l.d, &en.algo, impl_->workspace, impl_->workspace_bytes, stream),
           "cublasLtMatmul", a);
}

std::string Gemm::debug_string() const {
  std::string out;
  for (const auto& [key, en] : impl_->cache) {
    out += en.info;
    out += '\n';
  }
  return out;
}

}  // namespace troupe::gpu
