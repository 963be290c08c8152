// A verified step's time (verify/recorder.h): the world's, from the first rank's start to the last
// rank's end, the same on every rank.
#include <vector>

#include "comm/comm_choice.h"
#include "test_helpers.h"
#include "verify/recorder.h"

using namespace ptool;

namespace test_step_timing {

TEST_CASE("the world's step runs from the first rank's start to the last rank's end, on every rank",
          "[cpu]") {
    std::vector<double> seen(3);
    run_ranks(
        3, CommOptions{},
        [&](Communicator& c) {  // starts 10, 12, 14; ends 11, 17, 15
            const double started = 10 + 2 * c.rank(), seconds = c.rank() == 1 ? 5 : 1;
            seen[c.rank()] = world_step_seconds(c, started, seconds);
        },
        Device::cpu);
    for (double s : seen) CHECK(s == 7.0);
}

}  // namespace test_step_timing
