// Catch2 main for single-process tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
