/* dynlib.h. */
#include "common/dynlib.h"

#include <dlfcn.h>
#include <stdio.h>

void *dynlib_open(const char *name, const dynlib_sym *syms, int n, char *what, size_t what_size)
{
    for (int i = 0; i < n; i++) *syms[i].fn = NULL;
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(what, what_size, "%s not found (%s); put its folder in LD_LIBRARY_PATH", name,
                 dlerror());
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        *syms[i].fn = dlsym(lib, syms[i].name);
        if (!*syms[i].fn) {
            snprintf(what, what_size, "%s lacks %s", name, syms[i].name);
            for (int j = 0; j <= i; j++) *syms[j].fn = NULL;
            dlclose(lib);
            return NULL;
        }
    }
    return lib;
}

void dynlib_close(void *lib)
{
    if (lib) dlclose(lib);
}
