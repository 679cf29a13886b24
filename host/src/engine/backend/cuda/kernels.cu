// dspark's CUDA kernels, compiled at run time by NVRTC straight to CUBIN for the device's
// architecture (no PTX JIT, so no PTX-version mismatch with the driver). No headers: half and
// bfloat16 are converted with PTX `cvt` and bit shifts, so NVRTC needs nothing but itself.
//
// Layouts match the CPU backend: activations are row-major [rows, cols] f32; the KV cache is
// [slots, kv_heads * head_dim] f16 per layer for keys and for values; token masks are the
// plugins' bitsets (bit i of word i / 32, least significant bit first), one row per sequence.

typedef unsigned short half_bits;
typedef unsigned short bf16_bits;
typedef unsigned int u32;

__device__ __forceinline__ float half_to_float(half_bits h) {
    float f;
    asm("{ .reg .f16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ half_bits float_to_half(float f) {
    half_bits h;
    asm("{ .reg .f16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_to_float(bf16_bits b) {
    return __uint_as_float(((u32)b) << 16);
}

#define NEG_INF (__int_as_float(0xff800000))

// Sum over a block of up to 1024 threads; `shared` holds 32 floats.
__device__ float block_sum(float v, float* shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? shared[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

__device__ float block_max(float v, float* shared) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? shared[lane] : NEG_INF;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// out[r, :] = table[tokens[r], :] (bf16 table). Grid: rows; block: any.
extern "C" __global__ void embedding_gather(const bf16_bits* table, const u32* tokens, float* out, int cols) {
    const bf16_bits* src = table + (size_t)tokens[blockIdx.x] * cols;
    float* dst = out + (size_t)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = bf16_to_float(src[c]);
}

// RMSNorm fused with the residual add: h = x (+ residual); residual_out = h (when given);
// out = h / sqrt(mean(h^2) + eps) * weight. Grid: rows; block: up to 1024 threads.
extern "C" __global__ void rms_norm_residual(const float* x, const float* residual, float* residual_out,
                                             const float* weight, float* out, int cols, float eps) {
    __shared__ float shared[32];
    size_t base = (size_t)blockIdx.x * cols;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float h = x[base + c] + (residual ? residual[base + c] : 0.0f);
        if (residual_out) residual_out[base + c] = h;
        sum += h * h;
    }
    float scale = rsqrtf(block_sum(sum, shared) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float h = x[base + c] + (residual ? residual[base + c] : 0.0f);
        out[base + c] = h * scale * weight[c];
    }
}

// Rotary embedding in place on x [rows, heads * head_dim]. `interleaved`: pairs (2i, 2i+1)
// (GGML llama); else halves (i, i + d/2) (NeoX, qwen2). cos/sin: [positions, head_dim / 2].
// Grid: rows; block: heads * head_dim / 2 threads (looped when larger).
extern "C" __global__ void rope(float* x, const u32* positions, const float* cos_table, const float* sin_table,
                                int heads, int head_dim, int interleaved) {
    int half = head_dim / 2;
    size_t row = blockIdx.x;
    const float* c = cos_table + (size_t)positions[row] * half;
    const float* s = sin_table + (size_t)positions[row] * half;
    for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
        int h = j / half, i = j % half;
        float* head = x + row * heads * head_dim + (size_t)h * head_dim;
        int a = interleaved ? 2 * i : i;
        int b = interleaved ? 2 * i + 1 : i + half;
        float x0 = head[a], x1 = head[b];
        head[a] = x0 * c[i] - x1 * s[i];
        head[b] = x0 * s[i] + x1 * c[i];
    }
}

// out = silu(gate) * up, elementwise over n values.
extern "C" __global__ void silu_mul(const float* gate, const float* up, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        out[i] = g / (1.0f + __expf(-g)) * up[i];
    }
}

// x += y over n values.
extern "C" __global__ void add_assign(float* x, const float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// Writes row r of k and v ([rows, width] f32) to cache slot slots[r] (f16). Grid: rows.
extern "C" __global__ void write_kv(const float* k, const float* v, const u32* slots, half_bits* k_cache,
                                    half_bits* v_cache, int width) {
    size_t src = (size_t)blockIdx.x * width, dst = (size_t)slots[blockIdx.x] * width;
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
        k_cache[dst + c] = float_to_half(k[src + c]);
        v_cache[dst + c] = float_to_half(v[src + c]);
    }
}

// Paged attention for every row of a flattened batch (decode tokens, chunks and prefill
// alike): row r, query head h attends to positions 0..=positions[r] of its sequence, read
// through the sequence's block table. One block of 4 warps per (row, head); each warp takes
// every fourth key with an online softmax, lanes split the head's dimensions (head_dim <=
// 256), and the warps merge at the end.
// q: [rows, heads * head_dim]; out: same; block_tables: [seqs, max_blocks]; row_seq: [rows].
extern "C" __global__ void paged_attention(const float* q, const half_bits* k_cache, const half_bits* v_cache,
                                           const u32* block_tables, const u32* row_seq, const u32* positions,
                                           float* out, int heads, int kv_heads, int head_dim, int block_size,
                                           int max_blocks, float scale) {
    const int WARPS = 4, PER_LANE = 8;  // head_dim <= 32 * PER_LANE
    int row = blockIdx.x, h = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvh = h / (heads / kv_heads);
    int width = kv_heads * head_dim;
    const float* qh = q + (size_t)row * heads * head_dim + (size_t)h * head_dim;
    const u32* table = block_tables + (size_t)row_seq[row] * max_blocks;
    float qv[PER_LANE], acc[PER_LANE];
    for (int i = 0; i < PER_LANE; i++) {
        int d = lane + 32 * i;
        qv[i] = d < head_dim ? qh[d] * scale : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    int last = positions[row];
    for (int p = warp; p <= last; p += WARPS) {
        size_t slot = (size_t)table[p / block_size] * block_size + p % block_size;
        const half_bits* kp = k_cache + slot * width + (size_t)kvh * head_dim;
        float dot = 0.0f;
        for (int i = 0; i < PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d < head_dim) dot += qv[i] * half_to_float(kp[d]);
        }
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffff, dot, o);
        float m_new = fmaxf(m, dot);
        float correction = __expf(m - m_new), w = __expf(dot - m_new);
        const half_bits* vp = v_cache + slot * width + (size_t)kvh * head_dim;
        for (int i = 0; i < PER_LANE; i++) {
            int d = lane + 32 * i;
            acc[i] = acc[i] * correction + (d < head_dim ? w * half_to_float(vp[d]) : 0.0f);
        }
        l = l * correction + w;
        m = m_new;
    }
    __shared__ float sm[WARPS], sl[WARPS];
    __shared__ float sacc[WARPS][32 * PER_LANE];
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
    for (int i = 0; i < PER_LANE; i++) sacc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    if (warp == 0) {
        float mg = NEG_INF;
        for (int w = 0; w < WARPS; w++) mg = fmaxf(mg, sm[w]);
        float lg = 0.0f;
        for (int w = 0; w < WARPS; w++) lg += sl[w] * (sm[w] == NEG_INF ? 0.0f : __expf(sm[w] - mg));
        float* oh = out + (size_t)row * heads * head_dim + (size_t)h * head_dim;
        for (int i = 0; i < PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d >= head_dim) continue;
            float v = 0.0f;
            for (int w = 0; w < WARPS; w++) v += sacc[w][d] * (sm[w] == NEG_INF ? 0.0f : __expf(sm[w] - mg));
            oh[d] = v / lg;
        }
    }
}

// Sets logits of tokens a mask row disallows to -inf. mask: [rows, words]; mask_rows[r] is
// the mask row of logits row r, or -1 for an unconstrained row. Grid: (ceil(vocab/256), rows).
extern "C" __global__ void apply_token_bitmask(float* logits, const u32* mask, const int* mask_rows, int vocab,
                                               int words) {
    int row = blockIdx.y, t = blockIdx.x * blockDim.x + threadIdx.x;
    int m = mask_rows[row];
    if (t >= vocab || m < 0) return;
    int w = t >> 5;
    u32 bits = w < words ? mask[(size_t)m * words + w] : 0u;
    if (((bits >> (t & 31)) & 1u) == 0u) logits[(size_t)row * vocab + t] = NEG_INF;
}

// log_softmax (log_probs) or softmax of each row. Grid: rows; block: up to 1024.
extern "C" __global__ void softmax_rows(const float* logits, float* out, int vocab, float temperature, int log) {
    __shared__ float shared[32];
    const float* x = logits + (size_t)blockIdx.x * vocab;
    float* y = out + (size_t)blockIdx.x * vocab;
    float inv_t = 1.0f / temperature;
    float mx = NEG_INF;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, x[i] * inv_t);
    mx = block_max(mx, shared);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) sum += __expf(x[i] * inv_t - mx);
    sum = block_sum(sum, shared);
    float lse = mx + __logf(sum);
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float z = x[i] * inv_t - lse;
        y[i] = log ? z : __expf(z);
    }
}

// The index of each row's largest logit (the lowest index among equals, as the CPU sampler).
extern "C" __global__ void argmax_rows(const float* logits, u32* out, int vocab) {
    __shared__ float sv[1024];
    __shared__ int si[1024];
    const float* x = logits + (size_t)blockIdx.x * vocab;
    float best = NEG_INF;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = x[i];
        if (v > best || (v == best && i < bi)) { best = v; bi = i; }
    }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float v = sv[threadIdx.x + s];
            int i = si[threadIdx.x + s];
            if (v > sv[threadIdx.x] || (v == sv[threadIdx.x] && i < si[threadIdx.x])) {
                sv[threadIdx.x] = v;
                si[threadIdx.x] = i;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = si[0] == 0x7fffffff ? 0u : (u32)si[0];
}

// Samples one token per row from probabilities (softmax_rows output) restricted by top-k,
// top-p and min-p: the kept set is {i : p_i >= tau} for the most restrictive of the three
// thresholds (each found by bisection on the probability value, so no sort), and the token is
// found by inverse CDF with uniform[row] scaled to the kept mass. Ties at tau are kept
// together. top_k <= 0, top_p >= 1, min_p <= 0: no limit. Grid: rows; block: 1024 threads.
extern "C" __global__ void sample_rows(const float* probs, const float* uniform, u32* out, int vocab, int top_k,
                                       float top_p, float min_p) {
    __shared__ float shared[32];
    __shared__ float chunk_sums[1024];
    const float* p = probs + (size_t)blockIdx.x * vocab;
    float pmax = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) pmax = fmaxf(pmax, p[i]);
    pmax = block_max(pmax, shared);
    // The kept set is the most restrictive of the three: tau = max(tau_p, tau_k, min_p * pmax),
    // where tau_p is the largest threshold whose kept mass is still >= top_p and tau_k the
    // largest whose kept count is still >= top_k (both by bisection; both 0 when unlimited).
    float floor_p = min_p > 0.0f ? min_p * pmax : 0.0f;
    float tau_p = 0.0f, tau_k = 0.0f;
    for (int which = 0; which < 2; which++) {
        if (which == 0 && top_p >= 1.0f) continue;
        if (which == 1 && top_k <= 0) continue;
        float lo = 0.0f, hi = pmax;  // lo always meets the bound
        for (int it = 0; it < 40; it++) {
            float mid = 0.5f * (lo + hi);
            float acc = 0.0f;
            for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
                if (p[i] >= mid) acc += which == 0 ? p[i] : 1.0f;
            }
            acc = block_sum(acc, shared);
            bool ok = which == 0 ? acc >= top_p : acc >= (float)top_k;
            if (ok) lo = mid; else hi = mid;
        }
        if (which == 0) tau_p = lo; else tau_k = lo;
    }
    float lo = fmaxf(tau_p, tau_k);
    float tau = fmaxf(lo, floor_p);
    if (tau > pmax) tau = pmax;
    // Contiguous chunks per thread, so the prefix over threads is in index order.
    int per = (vocab + blockDim.x - 1) / blockDim.x;
    int begin = threadIdx.x * per, end = min(vocab, begin + per);
    float local = 0.0f;
    for (int i = begin; i < end; i++) if (p[i] >= tau) local += p[i];
    chunk_sums[threadIdx.x] = local;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int t = 0; t < blockDim.x; t++) total += chunk_sums[t];
        float target = uniform[blockIdx.x] * total, run = 0.0f;
        u32 pick = 0;
        bool found = false;
        for (int t = 0; t < blockDim.x && !found; t++) {
            if (run + chunk_sums[t] < target && t + 1 < blockDim.x) { run += chunk_sums[t]; continue; }
            int b = t * per, e = min(vocab, b + per);
            for (int i = b; i < e; i++) {
                if (p[i] < tau) continue;
                pick = (u32)i;
                run += p[i];
                if (run >= target) { found = true; break; }
            }
            if (!found && run >= target) found = true;
        }
        out[blockIdx.x] = pick;
    }
}
