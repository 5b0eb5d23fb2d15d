/* A C client of libklein's sessions: one prompt encoded once, one image per seed, on a base model
 * with classifier-free guidance (or a distilled one, which ignores it).
 *
 *   session MODEL_DIR OUT_PREFIX GUIDANCE SEED...     writes OUT_PREFIX-SEED.png per seed
 *
 * Build against an installed klein:  cc session.c $(pkg-config --cflags --libs klein)
 */
#include <stdio.h>
#include <stdlib.h>

#include "klein/klein_c.h"

static void on_log(const char* message, void* user_data) {
  (void)user_data;
  fprintf(stderr, "note: %s\n", message);
}

int main(int argc, char** argv) {
  klein_error err;
  klein_model* model = NULL;
  klein_session* session = NULL;
  klein_session_params sp;
  klein_image* image = NULL;
  int i, rc = 1;

  if (argc < 5) {
    fprintf(stderr, "usage: %s MODEL_DIR OUT_PREFIX GUIDANCE SEED...\n", argv[0]);
    return 2;
  }
  if (klein_model_open(argv[1], NULL, &model, &err) != KLEIN_OK) {
    fprintf(stderr, "klein_model_open: %s\n", err.message);
    return 1;
  }
  sp = klein_session_default_params();
  sp.guidance_scale = atof(argv[3]);
  sp.log = on_log;
  if (klein_session_create(model, &sp, &session, &err) != KLEIN_OK) {
    fprintf(stderr, "klein_session_create: %s\n", err.message);
    goto done;
  }
  /* Out of order: nothing to decode yet. */
  if (klein_session_decode(session, &image, &err) != KLEIN_INVALID_ARGUMENT) {
    fprintf(stderr, "decode before denoise was not refused\n");
    goto done;
  }
  fprintf(stderr, "refused as expected: %s\n", err.message);
  if (klein_session_encode_prompt(session, "a red fox in the snow", &err) != KLEIN_OK) {
    fprintf(stderr, "klein_session_encode_prompt: %s\n", err.message);
    goto done;
  }
  for (i = 4; i < argc; ++i) {
    char path[4096];
    klein_denoise_params dp = klein_denoise_default_params();
    dp.width = 32;
    dp.height = 32;
    dp.steps = 2;
    dp.seed = strtoull(argv[i], NULL, 10);
    if (klein_session_denoise(session, &dp, &err) != KLEIN_OK || klein_session_decode(session, &image, &err) != KLEIN_OK) {
      fprintf(stderr, "seed %s: %s\n", argv[i], err.message);
      goto done;
    }
    snprintf(path, sizeof path, "%s-%s.png", argv[2], argv[i]);
    if (klein_image_save_png(image, path, &err) != KLEIN_OK) {
      fprintf(stderr, "klein_image_save_png: %s\n", err.message);
      goto done;
    }
    klein_image_free(image);
    image = NULL;
    printf("wrote %s (guidance %s)\n", path, klein_session_guided(session) ? "on" : "off");
  }
  rc = 0;
done:
  klein_image_free(image);
  klein_session_free(session);
  klein_model_free(model);
  return rc;
}
