#include <filesystem>

#include "core/yaml_reader.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_yaml {

TEST_CASE("strict maps reject duplicate and unknown keys with their position", "[cpu]") {
    require_input_error([] { YamlMap m(load_yaml_text("a: 1\nb: 2\na: 3\n", "f.yaml"), "the thing"); },
                        {"f.yaml:3:1", "duplicate key 'a'"});
    require_input_error(
        [] {
            YamlMap m(load_yaml_text("lr: 1\nmomentun: 2\n", "f.yaml"), "the optimizer");
            m.get("lr");
            m.get("momentum");
            m.finish();
        },
        {"f.yaml:2:1", "unknown key 'momentun'", "did you mean 'momentum'"});
}

TEST_CASE("syntax errors, deep nesting and huge documents are rejected before yaml-cpp recurses", "[cpu]") {
    require_input_error([] { load_yaml_text("a: [1, 2\n", "f.yaml"); }, {"f.yaml:"});
    require_input_error([] { load_yaml_text("a: " + std::string(100000, '[') + "\n", "f.yaml"); },
                        {"nesting deeper"});
    std::string dashes;
    for (int i = 0; i < 200; ++i) dashes += "- ";
    require_input_error([] { load_yaml_text("", "f.yaml"); }, {"empty"});
    require_input_error([&] { load_yaml_text("a:\n  " + dashes + "x\n", "f.yaml"); }, {"nest deeper"});
    require_input_error([] { load_yaml_text(std::string(5 << 20, '#'), "f.yaml"); }, {"over the limit"});
    require_input_error([] { load_yaml_text("- 1\n- 2\n", "f.yaml"); }, {"top level must be a map"});
}

TEST_CASE("the nesting prescan takes quotes and comments where YAML does", "[cpu]") {
    // a module named x"[[[... (a name may hold a quote; ptool writes it \" in the plans it emits)
    const std::string brackets(100, '[');
    YamlNode root = load_yaml_text("a: \"x\\\" " + brackets + "\"\nb: 'y'' " + brackets + "'\n", "f.yaml");
    YamlMap m(root, "x");
    CHECK(m.at("a").as_string("'a'") == "x\" " + brackets);
    CHECK(m.at("b").as_string("'b'") == "y' " + brackets);
    // outside quotes the brackets still count
    require_input_error([&] { load_yaml_text("a: \"x\\\\\" " + brackets + "\n", "f.yaml"); },
                        {"nesting deeper"});
    // a quote or '#' inside a plain scalar is text: the brackets after it count (where they were taken
    // for a quoted scalar's or a comment's, yaml-cpp met them and its own depth guard said "bad file")
    const std::string deep = std::string(100, '[') + std::string(100, ']');
    require_input_error([&] { load_yaml_text("n: x\" y\\\"\nm: " + deep + "\n", "f.yaml"); },
                        {"f.yaml:2:68", "nesting deeper"});
    require_input_error([&] { load_yaml_text("n: it's\nm: " + deep + "\n", "f.yaml"); },
                        {"f.yaml:2:68", "nesting deeper"});
    require_input_error([&] { load_yaml_text("m: {b: x#" + deep + "}\n", "f.yaml"); },
                        {"f.yaml:1:", "nesting deeper"});
    // a comment after a space and a quoted key at a line's start are what they are
    YamlNode c = load_yaml_text("\"k\": 1 # [[[[\n", "f.yaml");
    CHECK(YamlMap(c, "c").at("k").as_int("'k'") == 1);
}

TEST_CASE("typed reads name the key and the expected type", "[cpu]") {
    YamlNode root = load_yaml_text("n: abc\nshape: [2, 0]\nf: 1.5x\nb: maybe\n", "f.yaml");
    YamlMap m(root, "x");
    require_input_error([&] { m.at("n").as_int("'n'"); },
                        {"f.yaml:1:4", "'n' must be an integer, got 'abc'"});
    require_input_error([&] { m.at("shape").as_shape("'shape'"); }, {"f.yaml:2:", "must be positive"});
    require_input_error([&] { m.at("f").as_double("'f'"); }, {"'f' must be a finite number, got '1.5x'"});
    require_input_error([&] { m.at("b").as_bool("'b'"); }, {"true or false"});
    require_input_error([&] { m.at("missing"); }, {"missing the key 'missing'"});
}

TEST_CASE("an input error carries its location and its bare message as data", "[cpu]") {
    YamlNode root = load_yaml_text("a: 1\nout: 0\n", "bad.yaml");
    YamlMap m(root, "x");
    try {
        m.at("out").as_positive_int("'out'");
        FAIL("expected an InputError");
    } catch (const InputError& e) {
        CHECK(e.where().file == "bad.yaml");
        CHECK(e.where().line == 2);
        CHECK(e.where().column == 6);
        CHECK(e.message() == "'out' must be positive, got 0");
        CHECK(std::string(e.what()) == "bad.yaml:2:6: 'out' must be positive, got 0");  // what() as before
    }
    const InputError bare("no place");  // a flag, an environment variable
    CHECK(bare.where().file.empty());
    CHECK(bare.message() == "no place");
    CHECK(std::string(bare.what()) == "no place");
    const InputError file_only(SourceLocation{"plan.yaml", 0, 0}, "unreadable");
    CHECK(file_only.message() == "unreadable");
    CHECK(std::string(file_only.what()) == "plan.yaml: unreadable");
}

TEST_CASE("yaml_unaliased: an alias becomes a copy of its own, a document without one stays itself",
          "[cpu]") {
    YAML::Node doc = YAML::Load("rows: [&r 64, 8]\ncount: *r\nname: \"010\"\nshape: {a: &m [1, 2], b: *m}\n");
    YAML::Node apart = yaml_unaliased(doc);
    apart["count"] = 4;  // an edit through one name: through the alias it was the rows' too
    apart["shape"]["b"][0] = 9;
    CHECK(apart["rows"][0].Scalar() == "64");
    CHECK(apart["count"].Scalar() == "4");
    CHECK(apart["shape"]["a"][0].Scalar() == "1");
    CHECK(apart["name"].Scalar() == "010");
    CHECK(apart["name"].Tag() == doc["name"].Tag());  // quoted: a string still
    CHECK(apart["rows"].Style() == YAML::EmitterStyle::Flow);
    doc["count"] = 5;  // (the document as parsed shares the node)
    CHECK(doc["rows"][0].Scalar() == "5");
    YAML::Node plain = YAML::Load("a: 1\nb: [2, 3]\n");
    YAML::Node same = yaml_unaliased(plain);
    CHECK(same.is(plain));
    CHECK(same["b"].Mark().line == 1);  // its marks kept
    // no shipped model has an alias, so none is copied (a false alias would only cost its marks)
    for (const char* dir : {PTOOL_SOURCE_DIR "/models", PTOOL_SOURCE_DIR "/models/scale"})
        for (const auto& entry : std::filesystem::directory_iterator(dir)) {
            if (entry.path().extension() != ".yaml") continue;
            INFO(entry.path().string());
            const YAML::Node model = YAML::Load(read_text(entry.path().string()));
            CHECK(yaml_unaliased(model).is(model));
        }
}

}  // namespace test_yaml
