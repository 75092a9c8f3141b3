// cxxopts, configured once for every command line the trainer parses: a repeated option's value
// is taken whole, commas included (--set data.shape=[3,32,32]).
#pragma once

#define CXXOPTS_VECTOR_DELIMITER '\0'
#include <cxxopts.hpp>
