#include <filesystem>
#include <fstream>

#include "core/safetensors.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_safetensors {

namespace {
std::string with_header(const std::string& json, const std::string& data) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    return out + json + data;
}
}  // namespace

TEST_CASE("safetensors round-trips every dtype, shape and the metadata", "[cpu]") {
    TensorFile f;
    f.add("a.weight", Tensor::from_doubles({2, 3}, DType::float32, {1, 2, 3, 4, 5, 6}));
    f.add("b", Tensor::from_doubles({3}, DType::bfloat16, {1.5, -2, 0.25}));
    f.add("c", Tensor::from_doubles({1}, DType::float16, {0.5}));
    f.add("d", Tensor::from_doubles({2}, DType::float64, {1e-300, 3}));
    f.add("ids", Tensor::from_doubles({2, 2}, DType::int64, {0, 1, 2, 3}));
    f.add("scalar", Tensor::scalar(7, DType::float32));
    f.metadata["model_yaml"] = "name: x\n";
    TensorFile g = parse_safetensors(serialize_safetensors(f), "mem");
    REQUIRE(g.tensors.size() == f.tensors.size());
    for (const auto& [name, t] : f.tensors) {
        const Tensor* u = g.find(name);
        REQUIRE(u);
        CHECK(u->dtype() == t.dtype());
        CHECK(u->shape() == t.shape());
        CHECK(u->to_doubles() == t.to_doubles());
    }
    CHECK(g.metadata.at("model_yaml") == "name: x\n");
}

TEST_CASE("damaged safetensors files are InputErrors naming the problem", "[cpu]") {
    const std::string ok_data(8, '\0');
    require_input_error([] { parse_safetensors("abc", "f"); }, {"f", "shorter than the 8-byte"});
    require_input_error([] { parse_safetensors(std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8), "f"); },
                        {"over the limit"});
    require_input_error([] { parse_safetensors(std::string("\x40\x00\x00\x00\x00\x00\x00\x00{}", 10), "f"); },
                        {"runs past the end"});
    require_input_error([&] { parse_safetensors(with_header("{not json", ""), "f"); }, {"not valid JSON"});
    require_input_error([&] { parse_safetensors(with_header("[1]", ""), "f"); }, {"not a JSON object"});
    require_input_error(
        [&] {
            parse_safetensors(
                with_header(R"({"w":{"dtype":"Q8","shape":[2],"data_offsets":[0,8]}})", ok_data), "f");
        },
        {"tensor 'w'", "unsupported dtype 'Q8'"});
    require_input_error(
        [&] {
            parse_safetensors(
                with_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", ok_data), "f");
        },
        {"tensor 'w'", "needs 12"});
    require_input_error(
        [&] {
            parse_safetensors(
                with_header(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", ok_data), "f");
        },
        {"outside the 8 data bytes"});
    require_input_error(
        [&] {
            parse_safetensors(
                with_header(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", ok_data), "f");
        },
        {"non-negative"});
    require_input_error(
        [&] {
            parse_safetensors(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                          ok_data),
                              "f");
        },
        {"overlap or hole"});
    require_input_error(
        [&] {
            parse_safetensors(
                with_header(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                            ok_data),
                "f");
        },
        {"too large"});
    require_input_error([&] { parse_safetensors(with_header(R"({"w":{"dtype":"F32"}})", ""), "f"); },
                        {"must have dtype, shape and data_offsets"});
}

TEST_CASE("writes are atomic and refuse to overwrite unless asked", "[cpu]") {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / "ptool_test_atomic";
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string path = (dir / "g.safetensors").string();
    TensorFile f;
    f.add("x", Tensor::from_doubles({2}, DType::float32, {1, 2}));
    write_safetensors(path, f, false);
    require_input_error([&] { write_safetensors(path, f, false); }, {"file exists", "--force"});
    f.tensors[0].second.set(0, 5);
    write_safetensors(path, f, true);
    CHECK(read_safetensors(path).find("x")->item(0) == 5);
    int entries = 0;
    for (auto it = fs::directory_iterator(dir); it != fs::directory_iterator(); ++it) ++entries;
    CHECK(entries == 1);  // no temporary left behind
    fs::remove_all(dir);
}

}  // namespace test_safetensors
