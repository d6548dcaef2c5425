/* The hot loops of the convert stage, in C: ttnn's TILE layout of one bf16 matrix, as bfloat16 (a relayout) or
 * bfloat8_b (packed), and the 2-D transpose the port's linear weights need. The rules are the ones
 * tasks/tensorbin.py spells out and tests/test_tensorbin.py holds to ttnn bit for bit; this file only makes them
 * fast (one pass, no temporaries, one thread: the graph runs two of these at once on two cores).
 *
 * Built by tasks/kernels.py (cc -O3 -shared) and called through ctypes; every function works on one matrix
 * [rows, cols] whose rows are `stride` elements apart, zero-padded to multiples of 32 on the way out.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define TILE 32
#define FACE 16

/* The source value at (r, c) of the padded matrix: zero outside the logical one. */
static inline uint16_t at(const uint16_t *src, int64_t rows, int64_t cols, int64_t stride, int64_t r, int64_t c) {
    return (r < rows && c < cols) ? src[r * stride + c] : 0;
}

/* One face row (16 values starting at (r, c)) into `out`, zeros past the logical edge. */
static inline void face_row(const uint16_t *src, int64_t rows, int64_t cols, int64_t stride, int64_t r, int64_t c,
                            uint16_t out[FACE]) {
    if (r < rows && c + FACE <= cols) {
        memcpy(out, src + r * stride + c, FACE * sizeof(uint16_t));
        return;
    }
    for (int i = 0; i < FACE; i++) out[i] = at(src, rows, cols, stride, r, c + i);
}

/* bfloat16 TILE: every tile's four faces, each row-major. `dst` holds ceil(rows/32)*ceil(cols/32)*1024 values. */
void tilize_bf16(const uint16_t *src, int64_t rows, int64_t cols, int64_t stride, uint16_t *dst) {
    int64_t trows = (rows + TILE - 1) / TILE, tcols = (cols + TILE - 1) / TILE;
    for (int64_t tr = 0; tr < trows; tr++)
        for (int64_t tc = 0; tc < tcols; tc++)
            for (int f = 0; f < 4; f++)
                for (int r = 0; r < FACE; r++, dst += FACE)
                    face_row(src, rows, cols, stride, tr * TILE + (f >> 1) * FACE + r, tc * TILE + (f & 1) * FACE, dst);
}

/* The inverse of tilize_bf16: the logical [rows, cols] matrix (rows `stride` apart in `dst`) out of a bfloat16
 * TILE buffer, its zero padding dropped. A cache file is stored in tile order, and a torch or Zarr reader wants
 * the values in rows. */
void untilize_bf16(const uint16_t *src, int64_t rows, int64_t cols, int64_t stride, uint16_t *dst) {
    int64_t trows = (rows + TILE - 1) / TILE, tcols = (cols + TILE - 1) / TILE;
    for (int64_t tr = 0; tr < trows; tr++)
        for (int64_t tc = 0; tc < tcols; tc++)
            for (int f = 0; f < 4; f++)
                for (int r = 0; r < FACE; r++, src += FACE) {
                    int64_t row = tr * TILE + (f >> 1) * FACE + r, col = tc * TILE + (f & 1) * FACE;
                    if (row >= rows || col >= cols) continue;
                    memcpy(dst + row * stride + col, src, (size_t)(cols - col < FACE ? cols - col : FACE) * sizeof(uint16_t));
                }
}

/* One bfloat8_b code: a bf16 value whose face row shares exponent field `shared` (tasks/tensorbin.py,
 * _reference_codes): the 8-bit significand shifted right by gap + 1 bits, rounded to nearest-even, saturated. */
static inline uint8_t bfp8_code(uint16_t bits, int shared) {
    int exp = (bits >> 7) & 0xFF;
    int significand = exp ? ((bits & 0x7F) | 0x80) : 0;
    int drop = shared - exp + 1;
    if (drop > 9) drop = 9;
    int kept = significand >> drop, rest = significand & ((1 << drop) - 1), half = 1 << (drop - 1);
    int magnitude = kept + (rest > half || (rest == half && (kept & 1)));
    if (magnitude > 127) magnitude = 127;
    return (uint8_t)(magnitude | (magnitude ? (bits >> 8) & 0x80 : 0));
}

/* The float32 a code reads back as: magnitude * 2**(shared - 133) (`scale`: exact, a 7-bit magnitude times a
 * power of two), signed; NaN for a full-width magnitude above 64 in a row that held an Inf or NaN (shared 255). */
static inline float bfp8_value(uint8_t code, int shared, float scale) {
    int magnitude = code & 0x7F;
    float v = (shared == 255 && magnitude > 64) ? NAN : (float)magnitude * scale;
    return (code & 0x80) ? -v : v;
}

static inline float bf16_value(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float v;
    memcpy(&v, &wide, sizeof v);
    return v;
}

/* 2**k as a float (k in -149..127), for the per-row read-back scale 2**(shared - 133). */
static float SCALE[256];

__attribute__((constructor)) static void init_scales(void) {
    for (int shared = 0; shared < 256; shared++) SCALE[shared] = ldexpf(1.0f, shared - 133);
}

static inline float bits_to_float(uint32_t bits) {
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* Per-lane running numerics of one face (16 rows), folded into double per face: the lanes vectorize, and a lane
 * sums only 16 values in float before it is widened. */
typedef struct {
    float back[FACE], ref[FACE], back2[FACE], ref2[FACE], cross[FACE], worst[FACE];
} Lanes;

/* One face row: its shared exponent, its 16 codes, and its numerics into `lanes`. Branch-free, so it vectorizes:
 * a code's magnitude is the 8-bit significand times 2**-(gap + 1), rounded to nearest-even (adding and taking
 * away 2**23 rounds a float below 2**22 to an integer, ties to even), saturated at 127 — the same numbers as
 * bfp8_code's shifts (a gap of 8 or more leaves 0 either way). */
static inline void pack_face_row(const uint16_t row[FACE], uint8_t *shared_out, uint8_t codes[FACE], Lanes *lanes) {
    uint16_t top = 0;  /* the largest exponent field, left in place (a max over 16-bit lanes vectorizes) */
    for (int i = 0; i < FACE; i++) {
        uint16_t e = row[i] & 0x7F80;
        top = e > top ? e : top;
    }
    int shared = top >> 7;
    *shared_out = (uint8_t)shared;
    if (shared == 255) {  /* an Inf or NaN in the row: the plain rule (convert refuses these before packing) */
        for (int i = 0; i < FACE; i++) {
            codes[i] = bfp8_code(row[i], shared);
            float back = bfp8_value(codes[i], shared, SCALE[shared]), ref = bf16_value(row[i]);
            lanes->back[i] += back, lanes->ref[i] += ref, lanes->back2[i] += back * back;
            lanes->ref2[i] += ref * ref, lanes->cross[i] += back * ref;
        }
        return;
    }
    float scale = SCALE[shared];
    for (int i = 0; i < FACE; i++) {
        uint32_t b = row[i];
        int32_t e = (b >> 7) & 0xFF, gap = shared - e;
        gap = gap < 9 ? gap : 9;
        int32_t significand = (int32_t)((b & 0x7F) | 0x80) & -(int32_t)(e != 0);
        float shifted = (float)significand * bits_to_float((uint32_t)(126 - gap) << 23);
        int32_t magnitude = (int32_t)((shifted + 8388608.0f) - 8388608.0f);
        magnitude = magnitude < 127 ? magnitude : 127;
        uint32_t negative = (b >> 15) & (magnitude != 0);
        codes[i] = (uint8_t)(magnitude | (negative << 7));
        float back = (float)magnitude * scale, ref = bits_to_float(b << 16);
        back = negative ? -back : back;
        float err = fabsf(back - ref);
        lanes->worst[i] = err > lanes->worst[i] ? err : lanes->worst[i];
        lanes->back[i] += back, lanes->ref[i] += ref, lanes->back2[i] += back * back;
        lanes->ref2[i] += ref * ref, lanes->cross[i] += back * ref;
    }
}

static void fold(Lanes *lanes, double *sums, float *worst) {
    for (int i = 0; i < FACE; i++) {
        sums[0] += lanes->back[i], sums[1] += lanes->ref[i], sums[2] += lanes->back2[i];
        sums[3] += lanes->ref2[i], sums[4] += lanes->cross[i];
        *worst = lanes->worst[i] > *worst ? lanes->worst[i] : *worst;
    }
    memset(lanes, 0, sizeof *lanes);
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

/* One face (16 rows of 16 values from (r0, c0)) with one face row per AVX-512 vector: the same numbers as
 * pack_face_row (which the compiler vectorized only 4 lanes wide, at ~1.5 GB/s), with the numerics kept in
 * registers across the face and folded into double once per face, in the same lane order. */
static void pack_face_avx512(const uint16_t *src, int64_t rows, int64_t cols, int64_t stride, int64_t r0, int64_t c0,
                             uint8_t *exps, uint8_t *codes, double *sums, float *worst) {
    __m512 acc_back = _mm512_setzero_ps(), acc_ref = _mm512_setzero_ps(), acc_back2 = _mm512_setzero_ps();
    __m512 acc_ref2 = _mm512_setzero_ps(), acc_cross = _mm512_setzero_ps(), acc_worst = _mm512_setzero_ps();
    const __m512i ones7 = _mm512_set1_epi32(0x7F), hidden = _mm512_set1_epi32(0x80), sign = _mm512_set1_epi32(0x8000);
    uint16_t padded[FACE];
    for (int r = 0; r < FACE; r++, codes += FACE) {
        const uint16_t *row = padded;
        if (r0 + r < rows && c0 + FACE <= cols)
            row = src + (r0 + r) * stride + c0;
        else
            face_row(src, rows, cols, stride, r0 + r, c0, padded);
        __m256i raw = _mm256_loadu_si256((const __m256i *)row);
        __m256i fields = _mm256_and_si256(raw, _mm256_set1_epi16(0x7F80));
        __m128i half = _mm_max_epu16(_mm256_castsi256_si128(fields), _mm256_extracti128_si256(fields, 1));
        int top = 0xFFFF - _mm_extract_epi16(_mm_minpos_epu16(_mm_xor_si128(half, _mm_set1_epi16(-1))), 0);
        int shared = top >> 7;
        exps[r] = (uint8_t)shared;
        __m512i b = _mm512_cvtepu16_epi32(raw);
        __m512 back, ref = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
        if (shared == 255) {  /* an Inf or NaN in the row: the plain rule, as in pack_face_row (no error measured) */
            float backs[FACE];
            for (int i = 0; i < FACE; i++) {
                codes[i] = bfp8_code(row[i], shared);
                backs[i] = bfp8_value(codes[i], shared, SCALE[shared]);
            }
            back = _mm512_loadu_ps(backs);
        } else {
            __m512i e = _mm512_and_si512(_mm512_srli_epi32(b, 7), _mm512_set1_epi32(0xFF));
            __m512i gap = _mm512_min_epi32(_mm512_sub_epi32(_mm512_set1_epi32(shared), e), _mm512_set1_epi32(9));
            __m512i significand = _mm512_maskz_or_epi32(_mm512_test_epi32_mask(e, e), _mm512_and_si512(b, ones7), hidden);
            __m512 factor = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(126), gap), 23));
            __m512 shifted = _mm512_mul_ps(_mm512_cvtepi32_ps(significand), factor);
            __m512i magnitude = _mm512_cvt_roundps_epi32(shifted, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            magnitude = _mm512_min_epi32(magnitude, ones7);
            __mmask16 negative = _mm512_mask_test_epi32_mask(_mm512_test_epi32_mask(magnitude, magnitude), b, sign);
            _mm_storeu_si128((__m128i *)codes, _mm512_cvtepi32_epi8(_mm512_mask_or_epi32(magnitude, negative, magnitude, hidden)));
            back = _mm512_mul_ps(_mm512_cvtepi32_ps(magnitude), _mm512_set1_ps(SCALE[shared]));
            back = _mm512_mask_sub_ps(back, negative, _mm512_setzero_ps(), back);
            acc_worst = _mm512_max_ps(acc_worst, _mm512_abs_ps(_mm512_sub_ps(back, ref)));
        }
        acc_back = _mm512_add_ps(acc_back, back), acc_ref = _mm512_add_ps(acc_ref, ref);
        acc_back2 = _mm512_fmadd_ps(back, back, acc_back2), acc_ref2 = _mm512_fmadd_ps(ref, ref, acc_ref2);
        acc_cross = _mm512_fmadd_ps(back, ref, acc_cross);
    }
    Lanes lanes;
    _mm512_storeu_ps(lanes.back, acc_back), _mm512_storeu_ps(lanes.ref, acc_ref);
    _mm512_storeu_ps(lanes.back2, acc_back2), _mm512_storeu_ps(lanes.ref2, acc_ref2);
    _mm512_storeu_ps(lanes.cross, acc_cross), _mm512_storeu_ps(lanes.worst, acc_worst);
    fold(&lanes, sums, worst);
}
#endif

/* bfloat8_b TILE: per tile 64 shared exponents (face 0's 16 rows, then faces 1-3) and 1024 codes in the same
 * order. Also measures what the packing costs, on the values ttnn reads back: sums[5] += (sum back, sum ref,
 * back.back, ref.ref, back.ref), and *worst = max(*worst, |back - ref|) (meaningful for finite input). */
void pack_bfp8(const uint16_t *src, int64_t rows, int64_t cols, int64_t stride, uint8_t *dst, double *sums,
               float *worst) {
    int64_t trows = (rows + TILE - 1) / TILE, tcols = (cols + TILE - 1) / TILE;
    for (int64_t tr = 0; tr < trows; tr++)
        for (int64_t tc = 0; tc < tcols; tc++, dst += 64 + TILE * TILE) {
            uint8_t *exps = dst, *codes = dst + 64;
            for (int f = 0; f < 4; f++, exps += FACE, codes += FACE * FACE) {
                int64_t r0 = tr * TILE + (f >> 1) * FACE, c0 = tc * TILE + (f & 1) * FACE;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
                pack_face_avx512(src, rows, cols, stride, r0, c0, exps, codes, sums, worst);
#else
                uint16_t row[FACE];
                Lanes lanes;
                memset(&lanes, 0, sizeof lanes);
                for (int r = 0; r < FACE; r++) {
                    face_row(src, rows, cols, stride, r0 + r, c0, row);
                    pack_face_row(row, exps + r, codes + r * FACE, &lanes);
                }
                fold(&lanes, sums, worst);
#endif
            }
        }
}

#ifdef __SSE2__
#include <emmintrin.h>

/* An 8x8 block of 16-bit values transposed in registers: three rounds of interleaving (16-, 32-, 64-bit). */
static inline void transpose_8x8(const uint16_t *s, int64_t ss, uint16_t *d, int64_t ds) {
    __m128i a[8], b[8], c[8];
    for (int i = 0; i < 8; i++) a[i] = _mm_loadu_si128((const __m128i *)(s + i * ss));
    for (int i = 0; i < 4; i++) {
        b[2 * i] = _mm_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
        b[2 * i + 1] = _mm_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        c[4 * i] = _mm_unpacklo_epi32(b[4 * i], b[4 * i + 2]);
        c[4 * i + 1] = _mm_unpackhi_epi32(b[4 * i], b[4 * i + 2]);
        c[4 * i + 2] = _mm_unpacklo_epi32(b[4 * i + 1], b[4 * i + 3]);
        c[4 * i + 3] = _mm_unpackhi_epi32(b[4 * i + 1], b[4 * i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        _mm_storeu_si128((__m128i *)(d + (2 * i) * ds), _mm_unpacklo_epi64(c[i], c[i + 4]));
        _mm_storeu_si128((__m128i *)(d + (2 * i + 1) * ds), _mm_unpackhi_epi64(c[i], c[i + 4]));
    }
}
#endif

/* dst[c, r] = src[r, c] for a [rows, cols] source (rows `src_stride` apart) into rows `dst_stride` apart.
 * Blocks of 256 source rows by 8 columns: each block writes 8 destination rows of 512 contiguous bytes. Square
 * blocks put every row of a block in the same cache set when the stride is a multiple of 4 KB (as the weights'
 * are), and ran at ~2 GB/s; these run at 6-12 GB/s on the N1.6 shapes (8x8 SSE2 transposes inside). */
#define BLOCK_ROWS 256
#define BLOCK_COLS 8

void transpose_u16(const uint16_t *src, int64_t rows, int64_t cols, int64_t src_stride, uint16_t *dst,
                   int64_t dst_stride) {
    for (int64_t r0 = 0; r0 < rows; r0 += BLOCK_ROWS)
        for (int64_t c0 = 0; c0 < cols; c0 += BLOCK_COLS) {
            int64_t r1 = r0 + BLOCK_ROWS < rows ? r0 + BLOCK_ROWS : rows;
            int64_t c1 = c0 + BLOCK_COLS < cols ? c0 + BLOCK_COLS : cols;
            int64_t r8 = r0, c8 = c0;
#ifdef __SSE2__
            c8 = c1 - c0 == BLOCK_COLS ? c1 : c0;
            r8 = c8 > c0 ? r0 + (r1 - r0) / 8 * 8 : r0;
            for (int64_t r = r0; r < r8; r += 8)
                transpose_8x8(src + r * src_stride + c0, src_stride, dst + c0 * dst_stride + r, dst_stride);
#endif
            for (int64_t c = c0; c < c1; c++)  /* what the 8x8 blocks left: the last rows, or a narrow last column block */
                for (int64_t r = c < c8 ? r8 : r0; r < r1; r++) dst[c * dst_stride + r] = src[r * src_stride + c];
        }
}

/* float32 -> bfloat16 bits as torch's `.to(torch.bfloat16)` gives them: finite values rounded to nearest, ties to
 * even (c10's round_to_nearest_even), +-Inf kept, and every NaN written as `nan`, the one NaN torch writes (0xFFFF
 * from float32 on x86's vectorised path, 0x7FC0 from float16: no payload survives either). Branch-free, so the
 * compiler vectorises it. Returns -1, or the index of the first finite value that rounded to +-Inf (past bf16's
 * largest finite value), which the caller refuses by name. */
int64_t round_f32_bf16(const uint32_t *src, int64_t n, uint16_t *dst, uint16_t nan) {
    uint32_t overflowed = 0, nan_bits = nan;
    for (int64_t i = 0; i < n; i++) {  /* masks, not branches: one vector lane per value */
        uint32_t bits = src[i], magnitude = bits & 0x7FFFFFFFu;
        uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
        uint32_t finite = 0u - (uint32_t)(magnitude < 0x7F800000u), is_nan = 0u - (uint32_t)(magnitude > 0x7F800000u);
        uint32_t out = (finite & rounded) | (~finite & ((is_nan & nan_bits) | (~is_nan & (bits >> 16))));
        overflowed |= finite & (uint32_t)((out & 0x7F80u) == 0x7F80u);
        dst[i] = (uint16_t)out;
    }
    if (!overflowed) return -1;
    for (int64_t i = 0; i < n; i++)
        if ((src[i] & 0x7FFFFFFFu) < 0x7F800000u && (dst[i] & 0x7F80u) == 0x7F80u) return i;
    return -1;
}
