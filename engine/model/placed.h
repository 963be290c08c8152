// Placed: an activation (or its gradient) as a rank holds it: the local tensor, and its layout on
// the tensor-parallel mesh dim (the full shape and the placement). Modules hand Placed values to
// each other, so every activation carries its placement with it; the styles redistribute them and
// the recorder gathers them to full size by it. On one device everything is Replicate.
//
// Data parallelism splits the batch rows before anything else: `global` is this dp rank's rows.
#pragma once

#include "core/placement.h"

namespace ptool {

struct Placed {
    Tensor t;  // this rank's piece (the whole tensor when Replicate, a summand when Partial)
    Placement p;
    Shape global;

    Placed() = default;
    Placed(Tensor local)
        : t(std::move(local)), global(t.defined() ? t.shape() : Shape{}) {}  // NOLINT: Replicate
    Placed(Tensor local, Placement placement, Shape full)
        : t(std::move(local)), p(placement), global(std::move(full)) {}

    bool defined() const { return t.defined(); }
    Layout layout() const { return {global, p}; }
    Placed relabeled(const Placement& q) const { return {t, q, global}; }  // the same bytes read as q
};

}  // namespace ptool
