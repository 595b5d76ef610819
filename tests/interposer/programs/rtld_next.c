/* dlsym(RTLD_NEXT, ...) must keep meaning "after the caller" with the interposer's dlsym in front.
 * Built three ways: -DPART_B (libnext_b.so: defines lp_probe_value = 2 and looks up the next one),
 * -DPART_C (libnext_c.so: lp_probe_value = 3) and the program (linked with -lnext_b -lnext_c), which
 * prints what libnext_b's RTLD_NEXT lookup found: 3 is right; 2 would mean the lookup started after
 * the interposer instead of after libnext_b. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#if defined(PART_B)
int lp_probe_value(void) { return 2; }
int b_next_value(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "lp_probe_value");
    return next ? next() : -1;
}
#elif defined(PART_C)
int lp_probe_value(void) { return 3; }
#else
int b_next_value(void);
int main(void) {
    printf("%d\n", b_next_value());
    return 0;
}
#endif
