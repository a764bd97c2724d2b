// The one translation unit of a separately compiled program that compiles coltrain's definitions.
#include <coltrain/src.hpp>
