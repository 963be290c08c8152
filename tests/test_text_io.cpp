// Reading and writing text safely: strict JSON with positions, whole-string numbers, strings
// written into YAML through the emitter, outputs compared with inputs by identity, temporaries.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/file_roles.h"
#include "core/json_reader.h"
#include "core/numbers.h"
#include "core/temp_paths.h"
#include "core/yaml_reader.h"
#include "core/yaml_writer.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_text_io {

TEST_CASE("strict JSON: what JSON is not is refused at its line and column", "[cpu]") {
    require_input_error([] { load_json_text("{\"a\": 1,\n}", "c.json"); }, {"c.json:2:1", "not strict JSON"});
    require_input_error([] { load_json_text("{'a': 1}", "c.json"); }, {"c.json:1:2", "not strict JSON"});
    require_input_error([] { load_json_text("{\"a\": 012}", "c.json"); }, {"c.json:1:7", "not strict JSON"});
    require_input_error([] { load_json_text("{\"a\": NaN}", "c.json"); }, {"c.json:1:7"});
    require_input_error([] { load_json_text("{\"a\": 1e400}", "c.json"); }, {"c.json:1:7", "finite"});
    require_input_error([] { load_json_text("a: 1\n", "c.json"); }, {"c.json:1:1"});
    require_input_error([] { load_json_text("{\"a\": 1, \"b\": {\"a\": 2, \"a\": 3}}", "c.json"); },
                        {"c.json:1:24", "duplicate key \"a\""});
    require_input_error([] { load_json_text(std::string(100, '[') + std::string(100, ']'), "c.json"); },
                        {"c.json:1:65", "nesting deeper"});
    // found by fuzz_index: a repeated key whose first value holds a key its last lacks (the parsed
    // tree keeps the last) ended in an uncaught nlohmann exception
    require_input_error([] { load_json_text("{\"m\": {\"a:\": 1}, \"m\": {\"b\": [2]}}", "c.json"); },
                        {"c.json:1:18", "duplicate key \"m\""});
    // found by fuzz_hf_config: nlohmann ends its input at a NUL, so text after one was never read
    using namespace std::string_literals;
    require_input_error([] { load_json_text("{\"a\": 1}\n\0{\"a\0\": 2}"s, "c.json"); },
                        {"c.json:2:1", "a NUL byte"});
}

TEST_CASE("strict JSON: fields are typed, and a refusal is at the value", "[cpu]") {
    const JsonNode root = load_json_text(
        "{\n  \"n\": \"32\",\n  \"f\": 32.0,\n  \"b\": \"false\",\n  \"x\": 1.5,\n  \"é\": [true, 7]\n}",
        "c.json");
    require_input_error([&] { root.at("n").as_int("'n'"); },
                        {"c.json:2:8", "'n' must be an integer, got a string (\"32\")"});
    require_input_error([&] { root.at("f").as_int("'f'"); }, {"c.json:3:8", "must be an integer"});
    require_input_error([&] { root.at("b").as_bool("'b'"); },
                        {"c.json:4:8", "must be true or false, got a string"});
    CHECK(root.at("x").as_number("'x'") == 1.5);
    const auto items = root.at("é").items("'é'");
    CHECK(items[0].as_bool("0"));
    CHECK(items[1].as_positive_int("1") == 7);
    require_input_error([&] { items[1].as_string("1"); },
                        {"c.json:6:15", "must be a string"});  // columns count characters
    CHECK(root.at("é").key_where().column == 3);
    const auto members = root.members("root");
    REQUIRE(members.size() == 5);
    CHECK(members[0].first == "n");  // file order
    require_input_error([&] { root.at("missing"); }, {"c.json:1:1", "no \"missing\""});
}

TEST_CASE("numbers are the whole text", "[cpu]") {
    CHECK(parse_whole_int("010") == 10);
    CHECK(parse_whole_int("-3") == -3);
    for (const char* bad : {"", "-", "1e3", "2abc", "2.0", "+2", " 2", "0x10", "99999999999999999999"})
        CHECK_FALSE(parse_whole_int(bad));
    CHECK(parse_finite("1e-3") == 1e-3);
    CHECK(parse_finite(".5") == 0.5);
    CHECK(parse_finite("-2.") == -2.0);
    for (const char* bad : {"", ".", "nan", "inf", "1e400", "0x1p3", "1e", "1.5x", " 1", "1,5"})
        CHECK_FALSE(parse_finite(bad));
    CHECK(check_int_text("4097", 1, 4096).find("[1, 4096]") != std::string::npos);
    CHECK(check_real_text("0", 0, 1, true) != "");
    CHECK(check_real_text("1", 0, 1, true) == "");
}

TEST_CASE("strings written into YAML read back as themselves", "[cpu]") {
    using namespace std::string_literals;
    const std::string hostile[] = {
        "a\nsteps: 1"s, "q\"uote: [x]"s, "tab\there"s, "nul\0z"s, "\xc2\x85nel\xe2\x80\xa8"s,
        "-"s,           "true"s,         ""s,          "#c"s,     "x\x7f"s};
    for (const std::string& s_full : hostile) {
        INFO(s_full);
        for (const std::string& text : {yaml_quoted(s_full), yaml_scalar(s_full)}) {
            CHECK(text.find('\n') == std::string::npos);
            YamlMap m(load_yaml_text("k: " + text + "\nafter: 1\n", "w.yaml"), "w");
            // the scalar is the string; a string with a control character (tab excepted) is refused
            // where ptool reads it (YamlNode::as_string: it would reach the terminal raw)
            CHECK(m.at("k").raw().Scalar() == s_full);
            const bool control = std::any_of(s_full.begin(), s_full.end(),
                                             [](char c) {
                                                 const auto u = static_cast<unsigned char>(c);
                                                 return (u < 0x20 && u != '\t') || u == 0x7f;
                                             }) ||
                                 s_full.find("\xc2\x85") != std::string::npos;
            if (control)
                require_input_error([&] { m.at("k").as_string("k"); }, {"w.yaml:1:", "control character"});
            else
                CHECK(m.at("k").as_string("k") == s_full);
            m.at("after");
            m.finish();  // nothing else was added
        }
        const std::string comment = yaml_comment(s_full);
        for (unsigned char c : comment) CHECK((c >= 0x20 && c < 0x7f));
    }
    CHECK(yaml_scalar("layers") == "layers");  // plain where plain reads the same
    CHECK(yaml_quoted("layers.*.net1") == "\"layers.*.net1\"");
    CHECK(yaml_comment("models/mlp.yaml") == "models/mlp.yaml");
}

TEST_CASE("an output that names an input is refused by identity, not spelling", "[cpu]") {
    const TempDir dir("ptool-test-roles");
    const std::string in = dir.path() + "/in.yaml", link = dir.path() + "/link.yaml",
                      hard = dir.path() + "/hard.yaml";
    std::ofstream(in) << "x: 1\n";
    std::filesystem::create_symlink(in, link);
    REQUIRE(::link(in.c_str(), hard.c_str()) == 0);
    require_input_error([&] { FileRoles().input("MODEL", in).output("--json", link).check(); },
                        {"--json names the same file as the input MODEL"});
    require_input_error([&] { FileRoles().input("MODEL", hard).output("-o", in).check(); },
                        {"-o names the same file as the input MODEL"});
    require_input_error(
        [&] {
            FileRoles()
                .output("--json", dir.path() + "/new.json")
                .output("--junit", dir.path() + "/./new.json")
                .check();
        },
        {"--json and --junit name the same file"});
    FileRoles()
        .input("MODEL", in)
        .output("--json", dir.path() + "/out.json")
        .output("--junit", "/dev/null")
        .output("--csv", "/dev/null")
        .check();
    FileRoles().input("MODEL", in).output("--json", "").check();  // "" is no output
}

TEST_CASE("a temporary folder goes with what it holds", "[cpu]") {
    std::string path;
    {
        const TempDir dir("ptool-test-temp");
        path = dir.path();
        std::filesystem::create_directories(path + "/a/b");
        std::ofstream(path + "/a/b/f") << "x";
        CHECK(std::filesystem::is_directory(path));
    }
    CHECK_FALSE(std::filesystem::exists(path));
}

}  // namespace test_text_io
