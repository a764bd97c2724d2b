// A second file of consumer_separate that includes coltrain: with separate compilation it links
// without duplicate definitions, and without <coltrain/src.hpp> it compiles no transport code.
#include <coltrain/comm.hpp>

#if !COLTRAIN_SEPARATE_COMPILATION
#error "consumer_separate is built with COLTRAIN_SEPARATE_COMPILATION"
#endif

int rank_of(const coltrain::comm::Communicator& comm) { return comm.rank(); }
