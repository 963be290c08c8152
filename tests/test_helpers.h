// Helpers shared by the unit tests.
#pragma once

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/tensor.h"
#include "parallel/plan.h"

// Two tensors of the same shape and dtype, bit for bit.
inline bool same_bits(const ptool::Tensor& a, const ptool::Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && a.nbytes() == b.nbytes() &&
           std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Runs fn, expects an InputError whose message contains every fragment.
template <class F>
void require_input_error(F&& fn, std::initializer_list<std::string> fragments) {
    try {
        fn();
    } catch (const ptool::InputError& e) {
        const std::string msg = e.what();
        INFO("message: " << msg);
        for (const auto& f : fragments) CHECK(msg.find(f) != std::string::npos);
        return;
    }
    FAIL("expected an InputError");
}

// A whole text file (shipped models and plans).
inline std::string read_text(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The message of the InputError `text` raises as a plan ("p.yaml"), "" when it loads.
inline std::string plan_error(const std::string& text) {
    try {
        ptool::load_plan_text(text, "p.yaml");
    } catch (const ptool::InputError& e) {
        return e.what();
    }
    return "";
}
