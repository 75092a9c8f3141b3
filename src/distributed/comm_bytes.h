// What collectives moved, by kind (distributed::Group counts it; trainer bench reports it).
#pragma once

#include <cstdint>

namespace trainer::distributed {

// Payload bytes that collectives moved on this rank, by kind: each collective's whole tensors (an
// all-gather's output, a reduce-scatter's input, every broadcast tensor, an all-reduce's tensors).
struct CommBytes {
  int64_t all_reduce = 0;
  int64_t all_gather = 0;
  int64_t reduce_scatter = 0;
  int64_t broadcast = 0;

  int64_t total() const { return all_reduce + all_gather + reduce_scatter + broadcast; }
  CommBytes operator+(const CommBytes& more) const {
    return {all_reduce + more.all_reduce, all_gather + more.all_gather,
            reduce_scatter + more.reduce_scatter, broadcast + more.broadcast};
  }
  CommBytes operator-(const CommBytes& before) const {
    return {all_reduce - before.all_reduce, all_gather - before.all_gather,
            reduce_scatter - before.reduce_scatter, broadcast - before.broadcast};
  }
};

}  // namespace trainer::distributed
