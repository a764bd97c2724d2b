// Catch2 main for single-process tests.
#include "catch_session.hpp"

int main(int argc, char** argv) { return coltrain::test::run_catch_session(argc, argv); }
