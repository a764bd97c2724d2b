#pragma once
// coltrain's version, the one place it is written: CMake's project version (and through it the
// pkg-config file and the package's version file) is read from here, and code can test it at
// compile time, e.g.
//   #if COLTRAIN_VERSION >= COLTRAIN_MAKE_VERSION(0, 2, 0)

#define COLTRAIN_VERSION_MAJOR 0
#define COLTRAIN_VERSION_MINOR 1
#define COLTRAIN_VERSION_PATCH 0
#define COLTRAIN_VERSION_STRING "0.1.0"

// One number that orders versions: major * 10000 + minor * 100 + patch.
#define COLTRAIN_MAKE_VERSION(major, minor, patch) ((major)*10000 + (minor)*100 + (patch))
#define COLTRAIN_VERSION \
  COLTRAIN_MAKE_VERSION(COLTRAIN_VERSION_MAJOR, COLTRAIN_VERSION_MINOR, COLTRAIN_VERSION_PATCH)
