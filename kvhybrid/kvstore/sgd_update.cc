// MXNet's SGD update of one flat bucket of host memory, made by the store's communication
// thread right after the bucket's allreduce (flat_update.py), so that the caller's thread
// pushes no sgd_mom_update of its own: the update runs inside the allreduce's engine operation, on memory that operation already
// holds. The arithmetic is MXNet's SGDKernel / SGDMomKernel (src/operator/optimizer_op-inl.h):
// the same expressions in the same order and precision, so the weights match the operator's.
// Then the updated weights go to their outs (the Gluon parameters' arrays), each key's piece
// copied, where those lie in host memory: the operator that copied them was another push.
// Needs nothing of MXNet: plain pointers to the weights, the summed gradients and the momenta.
#include <cstdint>
#include <cstring>

namespace {

template <typename T>
inline T clip(T x, T bound) {   // mshadow_op::clip: NaN passes through
  if (x > bound) return bound;
  if (x < -bound) return -bound;
  return x;
}

// MXNet keeps the operator's parameters as float (SGDParam, SGDMomParam), also for
// float64 weights: each one is rounded to float before it meets the arithmetic's type.
template <typename T>
inline T parameter(double value) {
  return static_cast<T>(static_cast<float>(value));
}

template <typename T>
void update(T* weight, const T* grad, T* mom, int64_t n, double lr_, double wd_,
            double rescale_, double momentum_, double clip_) {
  const T lr = parameter<T>(lr_), wd = parameter<T>(wd_);
  const T rescale = parameter<T>(rescale_), momentum = parameter<T>(momentum_);
  const T bound = parameter<T>(clip_);
  const bool clipped = bound >= T(0);
  if (mom != nullptr) {   // sgd_mom_update
    if (clipped) {
      for (int64_t i = 0; i < n; ++i) {
        mom[i] = momentum * mom[i] - lr * wd * weight[i] - lr * clip(rescale * grad[i], bound);
        weight[i] = weight[i] + mom[i];
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        mom[i] = momentum * mom[i] - lr * wd * weight[i] - lr * rescale * grad[i];
        weight[i] = weight[i] + mom[i];
      }
    }
    return;
  }
  const T keep = T(1) - lr * wd;   // sgd_update
  if (clipped) {
    for (int64_t i = 0; i < n; ++i)
      weight[i] = keep * weight[i] - lr * clip(rescale * grad[i], bound);
  } else {
    const T step = lr * rescale;
    for (int64_t i = 0; i < n; ++i) weight[i] = keep * weight[i] - step * grad[i];
  }
}

}  // namespace

extern "C" {

// One SGD step of n elements: weight and mom (nullptr: no momentum) updated in place from
// grad. clip < 0: no clipping (MXNet's clip_gradient default, -1).
void kvhybrid_sgd_update_f32(float* weight, const float* grad, float* mom, int64_t n,
                             double lr, double wd, double rescale, double momentum,
                             double clip) {
  update<float>(weight, grad, mom, n, lr, wd, rescale, momentum, clip);
}

void kvhybrid_sgd_update_f64(double* weight, const double* grad, double* mom, int64_t n,
                             double lr, double wd, double rescale, double momentum,
                             double clip) {
  update<double>(weight, grad, mom, n, lr, wd, rescale, momentum, clip);
}

// Bytes [bounds[i], bounds[i + 1]) of src into dsts[i], for i < count.
void kvhybrid_copy_pieces(const char* src, char* const* dsts, const int64_t* bounds,
                          int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    std::memcpy(dsts[i], src + bounds[i], static_cast<size_t>(bounds[i + 1] - bounds[i]));
}

}  // extern "C"
