/* What this build of the library is: its version and the commit it was
 * built from (plans and the measurement cache record both). */
#include "stof.h"

#ifndef STOF_COMMIT
#define STOF_COMMIT "unknown"
#endif

const char *stof_version(void) {
    return STOF_VERSION_STRING;
}

const char *stof_build_commit(void) {
    return STOF_COMMIT;
}
