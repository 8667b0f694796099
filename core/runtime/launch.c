/* A context's launch thread with no Python on it: it runs llama_decode and signals its end.

   The engine thread hands a batch over (uma_launch_start, called with the GIL held: it only
   copies the batch and signals) and later waits for the rc (uma_launch_wait, called with the
   GIL released). A Python launch thread needs the GIL to start llama_decode and again once it
   returns; each time it takes the GIL from the engine thread, whose work bounds the ticks. */
#define _GNU_SOURCE /* pthread_setname_np */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct { /* llama.h's llama_batch (checked against ctypes' size at load) */
    int32_t n_tokens;
    int32_t *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
} batch_t;

typedef int32_t (*decode_fn)(void *ctx, batch_t batch);

enum { IDLE, PENDING, RUNNING, DONE, QUIT };

typedef struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int state;
    decode_fn decode;
    void *ctx;
    batch_t batch;
    int32_t rc;
    int64_t launches; /* llama_decode calls run here */
} launcher_t;

static void *run(void *arg) {
    launcher_t *l = arg;
    pthread_setname_np(pthread_self(), "uma-launch"); /* as top, py-spy and the tests see it */
    pthread_mutex_lock(&l->lock);
    for (;;) {
        while (l->state != PENDING && l->state != QUIT)
            pthread_cond_wait(&l->changed, &l->lock);
        if (l->state == QUIT)
            break;
        l->state = RUNNING;
        l->launches++;
        pthread_mutex_unlock(&l->lock);
        int32_t rc = l->decode(l->ctx, l->batch);
        pthread_mutex_lock(&l->lock);
        l->rc = rc;
        l->state = DONE;
        pthread_cond_broadcast(&l->changed);
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

size_t uma_launch_batch_size(void) { return sizeof(batch_t); }

int64_t uma_launch_count(launcher_t *l) {
    pthread_mutex_lock(&l->lock);
    int64_t n = l->launches;
    pthread_mutex_unlock(&l->lock);
    return n;
}

launcher_t *uma_launch_new(decode_fn decode) {
    launcher_t *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->decode = decode;
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->changed, NULL);
    if (pthread_create(&l->thread, NULL, run, l) != 0) {
        free(l);
        return NULL;
    }
    return l;
}

/* Start llama_decode(ctx, *batch) on the thread (the previous one must have been waited). */
void uma_launch_start(launcher_t *l, void *ctx, const batch_t *batch) {
    pthread_mutex_lock(&l->lock);
    l->ctx = ctx;
    l->batch = *batch;
    l->state = PENDING;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
}

/* Wait for the started llama_decode to return: its rc. */
int32_t uma_launch_wait(launcher_t *l) {
    pthread_mutex_lock(&l->lock);
    while (l->state == PENDING || l->state == RUNNING)
        pthread_cond_wait(&l->changed, &l->lock);
    int32_t rc = l->rc;
    l->state = IDLE;
    pthread_mutex_unlock(&l->lock);
    return rc;
}

void uma_launch_free(launcher_t *l) {
    uma_launch_wait(l);
    pthread_mutex_lock(&l->lock);
    l->state = QUIT;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
    pthread_join(l->thread, NULL);
    pthread_mutex_destroy(&l->lock);
    pthread_cond_destroy(&l->changed);
    free(l);
}
