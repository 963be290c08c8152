// The rows a moe layer (model/moe.h) computes on: each expert's tokens, gathered and put back at
// their places, and the host-side vectors its routing reads. Shared by the layer's own forward and
// backward (modules/moe.cpp) and its expert-parallel dispatch (modules/moe_dispatch.cpp); internal
// to the moe's files.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/moe_routing.h"
#include "model/placed.h"

namespace ptool::moe_rows {

std::vector<double> host_values(const Tensor& t);

// A tensor of `shape` on `device` holding `values` (meta: none).
Tensor device_tensor(const Shape& shape, DType dtype, Device device, const std::vector<double>& values);

// An expert's rows: the tokens of its slots, and each row's weight repeated over dim (a mul's operand).
struct ExpertRows {
    Tensor ids, weights;
    int64_t n = 0;
};
ExpertRows expert_rows(const Routing& r, int64_t e, int64_t k, int64_t dim, DType dtype, Device device);

// An expert's rows put back at its tokens' places: a tensor placed as `like` is, zero where a token
// did not go to the expert (what verify compares an expert by, on every data and cp layout).
Placed at_tokens(Backend& be, const ExpertRows& r, const Tensor& rows, const Placed& like);

// Row i of a and b [rows, dim]: their dot product, on the host (meta: zeros, the products counted).
std::vector<double> row_dots(Backend& be, const Tensor& a, const Tensor& b, int64_t rows, int64_t dim);

}  // namespace ptool::moe_rows
