// Errors as data: RuntimeError's kind says whether its message names the rank, and the one check
// macro (core/check.h) reports the statement, where it is and the library's words.
#include <string>

#include "core/check.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_errors {

namespace {

// A library of our own, shaped as CUDA's: a status enum, a success value and a string per status.
enum class FakeStatus { ok, busy, broken };
int calls = 0;
FakeStatus fake_call(FakeStatus result) {
    ++calls;
    return result;
}
const char* fake_string(FakeStatus s) {
    return s == FakeStatus::broken ? "the device is broken" : "busy";
}
#define CHECK_FAKE(stmt)                                                                      \
    PTOOL_CHECK_STATUS(stmt, #stmt, status_ == FakeStatus::ok || status_ == FakeStatus::busy, \
                       fake_string(status_), ::ptool::throw_check_failure)

}  // namespace

TEST_CASE("RuntimeError's kind says whether the message names its rank", "[cpu]") {
    CHECK_FALSE(RuntimeError("out of descriptors").names_rank());
    CHECK(RuntimeError("out of descriptors").kind() == RuntimeError::Kind::other);
    for (RuntimeError::Kind k : {RuntimeError::Kind::mismatch, RuntimeError::Kind::timeout,
                                 RuntimeError::Kind::rank_failed, RuntimeError::Kind::misuse})
        CHECK(RuntimeError("rank 3 ...", k).names_rank());
}

TEST_CASE("one check macro: the statement once, file:line, the library's words, RuntimeError", "[cpu]") {
    calls = 0;
    CHECK_FAKE(fake_call(FakeStatus::ok));
    CHECK_FAKE(fake_call(FakeStatus::busy));  // a second success value (as ncclInProgress)
    CHECK(calls == 2);                        // each statement evaluated once
    const int line = __LINE__ + 2;
    try {
        CHECK_FAKE(fake_call(FakeStatus::broken));
        FAIL("no throw");
    } catch (const RuntimeError& e) {
        CHECK(std::string(e.what()) ==
              check_failure_message("fake_call(FakeStatus::broken)", __FILE__, line, "the device is broken"));
        CHECK(std::string(e.what()).find("fake_call(FakeStatus::broken) failed at ") == 0);
        CHECK(std::string(e.what()).find(fmt::format("test_errors.cpp:{}: the device is broken", line)) !=
              std::string::npos);
        CHECK(std::string(e.what()).find("../") == std::string::npos);  // the path from the source root
        CHECK(e.kind() == RuntimeError::Kind::other);
    }
    CHECK(calls == 3);
}

}  // namespace test_errors
