/* The chain's draw over rows of candidates, in C: one call a tick (core/draw.py).

   The same steps as draw.py's numpy draw (llama.cpp's order and maths): a greedy row takes
   its largest logit, the lowest id on a tie; a sampled row is sorted by logit (ties in column
   order), cut by top-k, min-p and top-p, and drawn once along the sorted row with its own
   uniform. On an H100's host each numpy call costs ~5-10 us right after the device's wait,
   and a tick's draw made ~10 of them a row (16 rows: 255-342 us a tick); here a row costs
   well under a microsecond. A wide row (a grammar's 16,384 device candidates) sorts only its
   top-k. Plain C, no Python.h: loaded with ctypes. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NO_ID INT32_MAX /* draw.py's: a row holding a NaN, which draw.py draws again */
#define RUN 16          /* the merge sort's runs, sorted by insertion first */

typedef struct {
    float logit;
    int32_t col;
} cand_t;

/* Descending by logit, ties in column order (keys are distinct: no stability needed). */
static inline int before(cand_t a, cand_t b) {
    return a.logit > b.logit || (a.logit == b.logit && a.col < b.col);
}

static void sort_desc(cand_t *a, cand_t *tmp, int64_t n) {
    for (int64_t s = 0; s < n; s += RUN) {
        int64_t e = s + RUN < n ? s + RUN : n;
        for (int64_t i = s + 1; i < e; i++) {
            cand_t x = a[i];
            int64_t j = i;
            for (; j > s && before(x, a[j - 1]); j--)
                a[j] = a[j - 1];
            a[j] = x;
        }
    }
    for (int64_t w = RUN; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = before(a[j], a[i]) ? a[j++] : a[i++];
            while (i < mid)
                tmp[k++] = a[i++];
            while (j < hi)
                tmp[k++] = a[j++];
        }
        memcpy(a, tmp, (size_t)n * sizeof *a);
    }
}

static inline int64_t id_at(const void *ids, int ids64, int64_t i) {
    return ids64 ? ((const int64_t *)ids)[i] : ((const int32_t *)ids)[i];
}

/* A greedy row: its largest logit's token, the lowest id on a tie (padding is -inf). */
static int64_t greedy(const void *ids, int ids64, const float *lg, int64_t width) {
    float peak = -INFINITY;
    for (int64_t i = 0; i < width; i++)
        peak = lg[i] > peak ? lg[i] : peak;
    int64_t best = NO_ID;
    for (int64_t i = 0; i < width; i++) {
        int64_t id = id_at(ids, ids64, i);
        if (lg[i] == peak && id < best)
            best = id;
    }
    return best;
}

/* A heap of the ``n`` best candidates met so far, its worst at the root (``before`` orders it). */
static void sift_down(cand_t *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && before(h[c], h[c + 1]))
            c++;
        if (!before(h[i], h[c]))
            return;
        cand_t x = h[i];
        h[i] = h[c];
        h[c] = x;
        i = c;
    }
}

/* The row's best ``k`` sorted into ``a`` (all of it where ``k`` is most of it); how many. A row
   much wider than its top-k (a grammar's 16,384 device candidates against a top-k of 40) keeps
   its best in a heap of ``k``, in one pass, rather than sorting it all; ties fall as in the
   whole row sorted (``before`` orders both). */
static int64_t sort_best(const float *lg, int64_t width, int64_t k, cand_t *a, cand_t *tmp) {
    if (k < 1 || k >= width / 4) {
        for (int64_t i = 0; i < width; i++)
            a[i] = (cand_t){lg[i], (int32_t)i};
        sort_desc(a, tmp, width);
        return width;
    }
    for (int64_t i = 0; i < k; i++)
        a[i] = (cand_t){lg[i], (int32_t)i};
    for (int64_t i = k / 2 - 1; i >= 0; i--)
        sift_down(a, k, i);
    float worst = a[0].logit;
    for (int64_t i = k; i < width; i++) {
        if (lg[i] < worst) /* most of a wide row: below every kept one */
            continue;
        cand_t c = {lg[i], (int32_t)i};
        if (before(c, a[0])) {
            a[0] = c;
            sift_down(a, k, 0);
            worst = a[0].logit;
        }
    }
    sort_desc(a, tmp, k);
    return k;
}

/* A sampled row's column: sorted, cut by top-k, min-p and top-p, drawn with ``u``. */
static int64_t sampled(const float *lg, int64_t width, const double *chain, double rest,
                       double u, cand_t *a, cand_t *tmp, double *w) {
    const double top_k = chain[0], log_min_p = chain[1], top_p = chain[2], temp = chain[3];
    int64_t k = top_k < (double)width ? (int64_t)top_k : width;
    const int64_t sorted = sort_best(lg, width, k, a, tmp);
    const double peak = a[0].logit;
    if (!isfinite(peak)) /* no finite peak (infinite logits): the row's first, as numpy's */
        return a[0].col;
    k = k < sorted ? k : sorted;
    int64_t n = 0; /* min-p keeps a prefix of the sorted top-k */
    while (n < k && (double)a[n].logit - peak >= log_min_p)
        n++;
    if (top_p < 1.0) { /* the first prefix of the top-k holding top_p of its mass */
        double mass = 0.0;
        for (int64_t i = 0; i < k; i++) {
            mass += exp((double)a[i].logit - peak);
            w[i] = mass;
        }
        const double cut = top_p * (mass + rest);
        int64_t nucleus = 0;
        while (nucleus < k && w[nucleus] < cut)
            nucleus++;
        n = nucleus + 1 < n ? nucleus + 1 : n;
    }
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        w[i] = exp(((double)a[i].logit - peak) / temp);
        total += w[i];
        w[i] = total; /* cumulative */
    }
    const double target = u * total;
    int64_t pick = 0;
    while (pick < n && w[pick] <= target)
        pick++;
    if (pick >= n) { /* u rounded up to the total: the last kept token with a weight */
        pick = n - 1;
        while (pick > 0 && w[pick] == w[pick - 1])
            pick--;
    }
    return a[pick].col;
}

/* draw's working arrays, kept: every call holds Python's GIL (draw.py loads this library as a
   PyDLL), so one set serves every thread */
static cand_t *scratch_a;
static double *scratch_w;
static int64_t scratch_width;

/* Each of ``rows`` rows of ``width`` candidates (ids int32, or int64 with ``ids64``; float32
   logits; both C-contiguous) to its token in ``tokens``: ``chains`` holds four numbers a row
   (top-k as a width, log min-p, top-p, temperature: <= 0 greedy), ``rests`` each row's other
   tokens' mass relative to its peak (NULL: none), ``uniforms`` each sampled row's draw in
   [0, 1). A row holding a NaN gives NO_ID. Returns -1 when out of memory, else 0. */
int uma_draw(int64_t rows, int64_t width, const void *ids, int ids64, const float *logits,
             const double *chains, const double *rests, const double *uniforms,
             int64_t *tokens) {
    if (width > scratch_width) { /* kept between calls: a wide row's 384 KB, mapped anew
                                    by each malloc, cost more than its draw */
        free(scratch_a);
        free(scratch_w);
        scratch_a = malloc((size_t)width * 2 * sizeof *scratch_a);
        scratch_w = malloc((size_t)width * sizeof *scratch_w);
        scratch_width = scratch_a && scratch_w ? width : 0;
        if (!scratch_width)
            return -1;
    }
    cand_t *a = scratch_a;
    double *w = scratch_w;
    for (int64_t r = 0; r < rows; r++) {
        const float *lg = logits + r * width;
        const void *row_ids = ids64 ? (const void *)((const int64_t *)ids + r * width)
                                    : (const void *)((const int32_t *)ids + r * width);
        int nan = 0;
        for (int64_t i = 0; i < width; i++)
            nan |= lg[i] != lg[i];
        if (nan) {
            tokens[r] = NO_ID;
        } else if (chains[4 * r + 3] <= 0.0) {
            tokens[r] = greedy(row_ids, ids64, lg, width);
        } else {
            int64_t col = sampled(lg, width, chains + 4 * r, rests ? rests[r] : 0.0,
                                  uniforms[r], a, a + width, w);
            tokens[r] = id_at(row_ids, ids64, col);
        }
    }
    return 0;
}
