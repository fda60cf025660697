#include "worker/dist/powersgd.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

// This file is compiled with -ffp-contract=off (CMakeLists.txt): the host
// Gram-Schmidt must round the same way on every rank, whatever the compiler
// could fuse into FMAs.

namespace trainctl::dist {
void DivideByWorldSize(at::Tensor& t, int world_size) {
  c10::NoGradGuard no_grad;
  at::Tensor divisor = c10::scalar_to_tensor(c10::Scalar(static_cast<int64_t>(world_size)));
  divisor.unsafeGetTensorImpl()->set_wrapped_number(true);
  t.div_(divisor);
}

bool PowerSgdShouldCompress(int64_t n, int64_t m, int64_t r, double min_compression_rate) {
  const double uncompressed = static_cast<double>(n) * static_cast<double>(m);
  const double compressed = static_cast<double>(n + m) * static_cast<double>(r);
  return compressed * min_compression_rate < uncompressed;
}

bool OrthogonalizeColumns(at::Tensor& matrix) {
  TORCH_CHECK(matrix.dim() == 2 && matrix.scalar_type() == at::kFloat,
              "OrthogonalizeColumns: a float32 matrix");
  c10::NoGradGuard no_grad;
  const bool in_place = matrix.is_cpu() && matrix.is_contiguous();
  at::Tensor host = in_place ? matrix : matrix.to(at::kCPU).contiguous();
  float* a = host.data_ptr<float>();
  const int64_t n = host.size(0);
  const int64_t r = host.size(1);
  bool ok = true;
  for (int64_t i = 0; i < r; ++i) {
    double s = 0;
    for (int64_t row = 0; row < n; ++row) {
      const double v = a[row * r + i];
      s += v * v;
    }
    if (!std::isfinite(s)) {
      ok = false;  // NaN or inf: left as it is, so that it shows in the result
      continue;
    }
    if (s == 0) {
      ok = false;
      for (int64_t row = 0; row < n; ++row) a[row * r + i] = 0.0f;
      continue;
    }
    const double norm = std::sqrt(s);
    for (int64_t row = 0; row < n; ++row) {
      a[row * r + i] = static_cast<float>(static_cast<double>(a[row * r + i]) / norm);
    }
    for (int64_t j = i + 1; j < r; ++j) {
      double d = 0;
      for (int64_t row = 0; row < n; ++row) {
        d += static_cast<double>(a[row * r + i]) * static_cast<double>(a[row * r + j]);
      }
      for (int64_t row = 0; row < n; ++row) {
        a[row * r + j] = static_cast<float>(static_cast<double>(a[row * r + j]) -
                                            d * static_cast<double>(a[row * r + i]));
      }
    }
  }
  if (!in_place) matrix.copy_(host);
  return ok;
}

void LowRankProduct(const at::Tensor& p, const at::Tensor& q, at::Tensor& out,
                    at::Tensor& scratch) {
  c10::NoGradGuard no_grad;
  const int64_t r = p.size(1);
  at::mul_out(out, p.select(1, 0).unsqueeze(1), q.select(1, 0).unsqueeze(0));
  for (int64_t k = 1; k < r; ++k) {
    at::mul_out(scratch, p.select(1, k).unsqueeze(1), q.select(1, k).unsqueeze(0));
    out.add_(scratch);
  }
}

void FillUniform(std::mt19937_64& rng, at::Tensor& t) {
  c10::NoGradGuard no_grad;
  at::Tensor host = at::empty({t.numel()}, at::TensorOptions().dtype(at::kFloat));
  float* h = host.data_ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    // 24 random bits: k * 2^-23 - 1 is exact in float32.
    const int64_t k = static_cast<int64_t>(rng() >> 40);
    h[i] = static_cast<float>(k - (int64_t{1} << 23)) * (1.0f / static_cast<float>(1 << 23));
  }
  t.copy_(host.view(t.sizes()));
}

PowerSgdBucket::PowerSgdBucket(const at::Tensor& flat, const std::vector<at::Tensor>& views,
                               const PowerSgdOptions& options)
    : options_(options), bucket_numel_(flat.numel()) {
  struct Plan {
    at::Tensor m;
    int64_t n, cols, r;
  };
  std::vector<Plan> plans;
  int64_t p_numel = 0, q_numel = 0, max_nm = 0;
  for (const at::Tensor& v : views) {
    if (v.dim() >= 2 && v.numel() > 0) {
      const int64_t n = v.size(0);
      const int64_t cols = v.numel() / n;
      const int64_t r = std::min({n, cols, options.rank});
      if (PowerSgdShouldCompress(n, cols, r, options.min_compression_rate)) {
        plans.push_back({v.view({n, cols}), n, cols, r});
        p_numel += n * r;
        q_numel += cols * r;
        if (r > 1) max_nm = std::max(max_nm, n * cols);
        continue;
      }
    }
    uncompressed_.push_back(v.view({-1}));
    uncompressed_numel_ += v.numel();
  }
  const auto opts = flat.options().requires_grad(false);
  stage1_ = at::zeros({uncompressed_numel_ + p_numel}, opts);
  q_ = at::zeros({q_numel}, opts);
  if (max_nm > 0) scratch_ = at::empty({max_nm}, opts);
  if (options.use_error_feedback) error_ = at::zeros({bucket_numel_}, opts);
  int64_t p_off = uncompressed_numel_, q_off = 0;
  for (const Plan& plan : plans) {
    Matrix mat;
    mat.m = plan.m;
    mat.p = stage1_.narrow(0, p_off, plan.n * plan.r).view({plan.n, plan.r});
    mat.q = q_.narrow(0, q_off, plan.cols * plan.r).view({plan.cols, plan.r});
    mat.n = plan.n;
    mat.cols = plan.cols;
    mat.r = plan.r;
    mat.p_off = p_off - uncompressed_numel_;
    mat.q_off = q_off;
    p_off += plan.n * plan.r;
    q_off += plan.cols * plan.r;
    matrices_.push_back(std::move(mat));
  }
}

bool PowerSgdBucket::OrthogonalizeFactors(bool of_p) {
  if (matrices_.empty()) return true;
  at::Tensor factors =
      of_p ? stage1_.narrow(0, uncompressed_numel_, stage1_.numel() - uncompressed_numel_) : q_;
  // A GPU bucket's factors come to the host once for the bucket, not once
  // per matrix (each copy waits for the stream).
  at::Tensor host = factors.is_cpu() ? factors : factors.to(at::kCPU);
  bool ok = true;
  for (const Matrix& mat : matrices_) {
    const int64_t rows = of_p ? mat.n : mat.cols;
    at::Tensor v = host.narrow(0, of_p ? mat.p_off : mat.q_off, rows * mat.r).view({rows, mat.r});
    ok = OrthogonalizeColumns(v) && ok;
  }
  if (!factors.is_cpu()) factors.copy_(host);
  return ok;
}

std::string PowerSgdBucket::Layout() const {
  std::string out = absl::StrCat("bucket ", bucket_numel_, ":");
  for (const Matrix& mat : matrices_) absl::StrAppend(&out, " ", mat.n, "x", mat.cols, "@", mat.r);
  return out;
}

void PowerSgdBucket::RestoreQ(const at::Tensor& q, bool has_q) {
  c10::NoGradGuard no_grad;
  q_.copy_(q);
  have_q_ = has_q && options_.warm_start;
}

void PowerSgdBucket::RestoreError(const at::Tensor& error) {
  c10::NoGradGuard no_grad;
  if (error_.defined()) error_.copy_(error);
}

int64_t PowerSgdBucket::wire_numel() const { return stage1_.numel() + q_.numel(); }

at::Tensor& PowerSgdBucket::Compress(at::Tensor& flat, std::mt19937_64& rng) {
  c10::NoGradGuard no_grad;
  if (error_.defined()) {
    flat.add_(error_);
    error_.copy_(flat);  // M_in; Decompress turns it into M_in - M_approx
  }
  int64_t off = 0;
  for (const at::Tensor& u : uncompressed_) {
    stage1_.narrow(0, off, u.numel()).copy_(u);
    off += u.numel();
  }
  // Q: last step's (warm start), orthogonalized, unless there is none or it
  // degenerated; then a fresh one. Q is the same bits on every rank, so every
  // rank decides alike and draws the same numbers.
  bool fresh = !options_.warm_start || !have_q_;
  if (!fresh && !OrthogonalizeFactors(/*of_p=*/false)) fresh = true;
  if (fresh) {
    for (Matrix& mat : matrices_) FillUniform(rng, mat.q);
    OrthogonalizeFactors(/*of_p=*/false);
  }
  for (Matrix& mat : matrices_) at::mm_out(mat.p, mat.m, mat.q);
  return stage1_;
}

at::Tensor& PowerSgdBucket::ComputeQ(int world_size) {
  c10::NoGradGuard no_grad;
  at::Tensor sum = stage1_.narrow(0, 0, uncompressed_numel_);
  DivideByWorldSize(sum, world_size);
  int64_t off = 0;
  for (at::Tensor& u : uncompressed_) {
    u.copy_(stage1_.narrow(0, off, u.numel()));
    off += u.numel();
  }
  // P is the sum over ranks; it is orthogonalized, so it needs no division.
  OrthogonalizeFactors(/*of_p=*/true);  // a zero or NaN column shows in the result
  for (Matrix& mat : matrices_) at::mm_out(mat.q, mat.m.t(), mat.p);
  return q_;
}

void PowerSgdBucket::Decompress(at::Tensor& flat, int world_size) {
  c10::NoGradGuard no_grad;
  DivideByWorldSize(q_, world_size);
  for (Matrix& mat : matrices_) {
    const int64_t n = mat.m.size(0), cols = mat.m.size(1);
    at::Tensor scratch =
        scratch_.defined() ? scratch_.narrow(0, 0, n * cols).view({n, cols}) : at::Tensor();
    LowRankProduct(mat.p, mat.q, mat.m, scratch);
  }
  if (error_.defined()) {
    error_.sub_(flat);
    // A step whose gradients overflowed leaves NaN/inf here; it restarts at 0.
    error_.nan_to_num_(0.0, 0.0, 0.0);
  }
  have_q_ = options_.warm_start;
}

}  // namespace trainctl::dist
