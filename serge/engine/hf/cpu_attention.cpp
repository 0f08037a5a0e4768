// One decode step's attention for every sequence of a pass, over each sequence's own KV buffers.
//
// Each (sequence, key head) is one work item, computed by the same sequential code whatever
// else is in the pass and however many threads run it: a row gets the bits it gets alone.
// The item first writes its new key and value at position `positions[i]`, then attends from
// max(0, positions[i] + 1 - window) (window 0: from 0) to positions[i] inclusive.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

namespace {

// 16 floats as one value: GCC and Clang lower it to the machine's vectors (AVX-512, AVX2, NEON).
typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t i16 __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef float v4 __attribute__((vector_size(16), aligned(4)));
constexpr int64_t kLanes = 16;
constexpr int64_t kTile = 64;  // values a tile: 16 KB of a 64-wide head, within L1

inline v16 load(const float* p) { v16 v; __builtin_memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, v16 v) { __builtin_memcpy(p, &v, sizeof v); }
inline v16 splat(float x) { return v16{} + x; }

// The 16 lanes added in a fixed order: halves, then quarters, then the last four pairwise.
inline float hsum(v16 v) {
  v8 lo, hi;
  __builtin_memcpy(&lo, &v, sizeof lo);
  __builtin_memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
  v8 e = lo + hi;
  v4 a, b;
  __builtin_memcpy(&a, &e, sizeof a);
  __builtin_memcpy(&b, reinterpret_cast<const char*>(&e) + sizeof a, sizeof b);
  v4 f = a + b;
  return (f[0] + f[2]) + (f[1] + f[3]);
}

// exp(x) for x <= 0 (Cephes' polynomial after a range reduction by ln 2), lane by lane.
inline v16 exp_neg(v16 x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  const v16 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  v16 t = x * 1.44269504088896341f + magic;
  v16 n = t - magic;
  v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
  v16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  i16 bits = (__builtin_convertvector(n, i16) + 127) << 23;
  v16 scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// q . k over `dim`: 16 partial sums, then added in a fixed order.
inline float dot(const float* q, const float* k, int64_t dim) {
  v16 part{};
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) part += load(q + d) * load(k + d);
  float tail = 0.f;
  for (; d < dim; ++d) tail += q[d] * k[d];
  return hsum(part) + tail;
}

// acc[0:dim] += sum over j of p[j] * v[j * vs + 0:dim], j in order, with the accumulators in registers
// where the row is 2, 4 or 8 vectors long.
template <int64_t D>
inline void weighted_sum_of(const float* p, const float* v, int64_t vs, int64_t length, float* acc) {
  v16 a[D];
  for (int64_t c = 0; c < D; ++c) a[c] = load(acc + c * kLanes);
  for (int64_t j = 0; j < length; ++j) {
    const v16 w = splat(p[j]);
    for (int64_t c = 0; c < D; ++c) a[c] += w * load(v + j * vs + c * kLanes);
  }
  for (int64_t c = 0; c < D; ++c) store(acc + c * kLanes, a[c]);
}

inline void weighted_sum(const float* p, const float* v, int64_t vs, int64_t length, int64_t dim, float* acc) {
  switch (dim) {
    case 32: return weighted_sum_of<2>(p, v, vs, length, acc);
    case 64: return weighted_sum_of<4>(p, v, vs, length, acc);
    case 128: return weighted_sum_of<8>(p, v, vs, length, acc);
  }
  for (int64_t j = 0; j < length; ++j)
    for (int64_t d = 0; d < dim; ++d) acc[d] += p[j] * v[j * vs + d];
}

void check_rows(const at::Tensor& t, const char* name, int64_t n, int64_t heads, int64_t dim) {
  TORCH_CHECK(t.dim() == 3 && t.size(0) == n && t.size(1) == heads && t.size(2) == dim && t.stride(2) == 1,
              name, ": expected [", n, ", ", heads, ", ", dim, "] with unit stride on the last dim");
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.device().is_cpu(), name, ": expected a float32 CPU tensor");
}

void decode_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                      at::TensorList keys, at::TensorList values, at::IntArrayRef positions, double scale,
                      int64_t window, const at::Tensor& out) {
  const int64_t n = query.size(0), heads = query.size(1), dim = query.size(2);
  const int64_t kv_heads = key.size(1);
  TORCH_CHECK(heads % kv_heads == 0, "query heads must be a multiple of key heads");
  check_rows(query, "query", n, heads, dim);
  check_rows(key, "key", n, kv_heads, dim);
  check_rows(value, "value", n, kv_heads, dim);
  check_rows(out, "out", n, heads, dim);
  TORCH_CHECK(static_cast<int64_t>(keys.size()) == n && static_cast<int64_t>(values.size()) == n &&
                  static_cast<int64_t>(positions.size()) == n, "one KV buffer and position per sequence");
  for (const auto i : c10::irange(n)) {
    for (const auto* t : {&keys[i], &values[i]}) {
      TORCH_CHECK(t->dim() == 3 && t->size(0) == kv_heads && t->size(2) == dim && t->stride(2) == 1 &&
                      t->scalar_type() == at::kFloat && t->device().is_cpu(),
                  "a KV buffer must be a float32 CPU [kv_heads, capacity, head_dim] tensor");
      TORCH_CHECK(positions[i] >= 0 && positions[i] < t->size(1), "position ", positions[i],
                  " is outside a KV buffer of ", t->size(1));
    }
  }
  const int64_t group = heads / kv_heads;
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(group * dim);
    std::vector<float> total(group);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / kv_heads, h = item % kv_heads, pos = positions[i];
      const at::Tensor &K = keys[i], &V = values[i];
      float* kbase = K.data_ptr<float>() + h * K.stride(0);
      float* vbase = V.data_ptr<float>() + h * V.stride(0);
      const int64_t ks = K.stride(1), vs = V.stride(1), qs = query.stride(1);
      const float* knew = key.data_ptr<float>() + i * key.stride(0) + h * key.stride(1);
      const float* vnew = value.data_ptr<float>() + i * value.stride(0) + h * value.stride(1);
      std::copy(knew, knew + dim, kbase + pos * ks);
      std::copy(vnew, vnew + dim, vbase + pos * vs);
      const int64_t first = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
      const int64_t length = pos + 1 - first;
      const int64_t padded = (length + kLanes - 1) / kLanes * kLanes;  // scores[r * padded + j]
      scores.resize(group * padded);
      const float* q = query.data_ptr<float>() + i * query.stride(0) + h * group * qs;
      for (int64_t j = 0; j < length; ++j) {
        const float* k = kbase + (first + j) * ks;
        for (int64_t r = 0; r < group; ++r) scores[r * padded + j] = dot(q + r * qs, k, dim) * fscale;
      }
      for (int64_t r = 0; r < group; ++r) {  // softmax's numerators, and their sum
        float* s = scores.data() + r * padded;
        std::fill(s + length, s + padded, s[0]);
        v16 top = load(s);
        for (int64_t j = kLanes; j < padded; j += kLanes) { v16 x = load(s + j); top = x > top ? x : top; }
        float m = top[0];
        for (int64_t l = 1; l < kLanes; ++l) m = top[l] > m ? top[l] : m;
        for (int64_t j = 0; j < padded; j += kLanes) store(s + j, exp_neg(load(s + j) - m));
        std::fill(s + length, s + padded, 0.f);
        v16 sum{};
        for (int64_t j = 0; j < padded; j += kLanes) sum += load(s + j);
        total[r] = hsum(sum);
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < length; t += kTile) {  // a tile of values, met by every query of the group
        const float* v = vbase + (first + t) * vs;
        for (int64_t r = 0; r < group; ++r)
          weighted_sum(scores.data() + r * padded + t, v, vs, std::min(kTile, length - t), dim, acc.data() + r * dim);
      }
      for (int64_t r = 0; r < group; ++r) {
        float* o = out.data_ptr<float>() + i * out.stride(0) + (h * group + r) * out.stride(1);
        const float inv = 1.f / total[r];
        for (int64_t d = 0; d < dim; ++d) o[d] = acc[r * dim + d] * inv;
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY(serge, m) {
  m.def("decode_attention(Tensor query, Tensor key, Tensor value, Tensor(b!)[] keys, Tensor(c!)[] values, "
        "int[] positions, float scale, int window, Tensor(a!) out) -> ()", decode_attention);
}
