/* A program using the installed stof: builds BigBird's mask for 1024 tokens
 * and says how sparse it is, then which GPU stof would run on (or why there
 * is none). Build it with find_package(stof) (CMakeLists.txt here) or with
 *   cc example.c $(pkg-config --cflags --libs stof)  */
#include <stdio.h>
#include <stof.h>

int main(void) {
    printf("stof %s\n", stof_version());
    stof_mask *mask = NULL;
    if (stof_mask_from_pattern("bigbird", 1, 1024, 1024, &mask) != STOF_OK) {
        fprintf(stderr, "example: %s\n", stof_last_error());
        return 1;
    }
    printf("bigbird at 1024 tokens: %.1f%% of the pairs attended\n",
           100.0 * stof_mask_density(mask));
    stof_mask_free(mask);
    stof_device_info dev;
    if (stof_device_query(0, &dev) == STOF_OK)
        printf("GPU 0: %s\n", dev.name);
    else
        printf("no GPU: %s\n", stof_last_error());
    return 0;
}
