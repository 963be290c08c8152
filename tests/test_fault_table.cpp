// The fault classes' table (verify/faults.h): every class parses by its name, hits the modules
// its pattern names, and a bad PTOOL_FAULT is refused naming every class there is.
#include <string>

#include "test_helpers.h"
#include "verify/faults.h"

using namespace ptool;

namespace test_fault_table {

TEST_CASE("parse_fault: every kind of the table by its name, the message for a bad one lists them all",
          "[cpu]") {
    for (const FaultClass& c : kFaultClasses) {
        INFO(c.name);
        const Fault f = parse_fault((std::string(c.name) + ":layers.0").c_str());
        CHECK(f.is(c.kind));
        CHECK(f.fqn == "layers.0");
        CHECK(std::string(fault_class(c.kind).name) == c.name);
        CHECK_FALSE(f.hits(c.kind, "layers.1"));
        CHECK(parse_fault((std::string(c.name) + ":*").c_str()).hits(c.kind, "anything"));
    }
    CHECK(parse_fault("").empty());
    CHECK(parse_fault(nullptr).empty());
    for (const char* bad : {"no_such:x", "skip_bucket", "skip_bucket:", ":x"}) {
        INFO(bad);
        try {
            parse_fault(bad);
            FAIL("accepted");
        } catch (const InputError& e) {
            const std::string m = e.what();
            CHECK(m.find(fmt::format("PTOOL_FAULT='{}'", bad)) != std::string::npos);
            for (const FaultClass& c : kFaultClasses) CHECK(m.find(c.name) != std::string::npos);
        }
    }
}

}  // namespace test_fault_table
