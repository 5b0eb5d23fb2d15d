/* A minimal C client of libklein: opens a model, generates a 64x64 image, saves a PNG.
 *
 *   generate MODEL_DIR OUT.png [SEED] [PROMPT]
 *
 * Build against an installed klein:  cc generate.c $(pkg-config --cflags --libs klein)
 */
#include <stdio.h>
#include <stdlib.h>

#include "klein/klein_c.h"

static void on_progress(const char* phase, int done, int total, void* user_data) {
  int* calls = (int*)user_data;
  ++*calls;
  fprintf(stderr, "%s %d/%d\n", phase, done, total);
}

static void on_log(const char* message, void* user_data) {
  (void)user_data;
  fprintf(stderr, "note: %s\n", message);
}

int main(int argc, char** argv) {
  klein_error err;
  klein_load_params lp;
  klein_generate_params gp;
  klein_model* model = NULL;
  klein_image* image = NULL;
  int progress_calls = 0;

  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL_DIR OUT.png [SEED] [PROMPT]\n", argv[0]);
    return 2;
  }
  lp = klein_load_default_params();
  if (klein_model_open(argv[1], &lp, &model, &err) != KLEIN_OK) {
    fprintf(stderr, "klein_model_open: %s\n", err.message);
    return 1;
  }
  gp = klein_generate_default_params();
  gp.prompt = argc > 4 ? argv[4] : "a red fox in the snow";
  gp.width = 64;
  gp.height = 64;
  gp.seed = argc > 3 ? strtoull(argv[3], NULL, 10) : 42;
  gp.progress = on_progress;
  gp.log = on_log;
  gp.user_data = &progress_calls;
  if (klein_model_generate(model, &gp, &image, &err) != KLEIN_OK) {
    fprintf(stderr, "klein_model_generate: %s\n", err.message);
    klein_model_free(model);
    return 1;
  }
  if (klein_image_save_png(image, argv[2], &err) != KLEIN_OK) {
    fprintf(stderr, "klein_image_save_png: %s\n", err.message);
    klein_image_free(image);
    klein_model_free(model);
    return 1;
  }
  printf("wrote %s (%dx%d) with klein.cpp %s, %d progress calls\n", argv[2], image->width, image->height,
         klein_version(), progress_calls);
  klein_image_free(image);
  klein_model_free(model);
  return progress_calls > 0 ? 0 : 1;
}
