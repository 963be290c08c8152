// Strict YAML reading for model and plan files.
//
// yaml-cpp accepts duplicate keys silently and recurses on nesting, so ptool:
//   - rejects documents over the size, line, nesting-depth and node-count limits before and after parsing;
//   - rejects duplicate keys and unknown keys ("did you mean" the closest known key);
//   - reports every error as InputError at file:line:column (1-based) of the offending node.
// YamlMap records every key the loader asks about; finish() rejects the rest.
#pragma once

#include <yaml-cpp/yaml.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "core/tensor.h"

namespace ptool {

struct YamlLimits {
    size_t max_bytes = 4 << 20;
    int max_depth = 64;
    int64_t max_nodes = 200000;
};

class YamlNode {
public:
    YamlNode(YAML::Node node, std::shared_ptr<const std::string> file)
        : node_(node), file_(std::move(file)) {}
    YamlNode(const YamlNode&) = default;
    // YAML::Node's assignment writes into the node it refers to (it would overwrite the document):
    // a YamlNode is never reassigned.
    YamlNode& operator=(const YamlNode&) = delete;

    const YAML::Node& raw() const { return node_; }
    const std::string& file() const { return *file_; }
    SourceLocation where() const;
    [[noreturn]] void fail(const std::string& message) const;

    bool is_map() const { return node_.IsMap(); }
    bool is_seq() const { return node_.IsSequence(); }
    bool is_scalar() const { return node_.IsScalar(); }
    bool is_null() const { return node_.IsNull(); }

    std::string as_string(const std::string& what) const;
    int64_t as_int(const std::string& what) const;
    int64_t as_positive_int(const std::string& what) const;  // > 0
    double as_double(const std::string& what) const;
    bool as_bool(const std::string& what) const;
    std::vector<YamlNode> items(const std::string& what) const;  // a sequence's elements
    Shape as_shape(const std::string& what) const;               // [d0, d1, ...], each > 0
    std::string text() const;                                    // the node as YAML text

private:
    friend class YamlMap;  // its nodes share the map's file name
    YAML::Node node_;
    std::shared_ptr<const std::string> file_;
};

class YamlMap {
public:
    YamlMap(const YamlNode& node, std::string what);  // what: "linear 'net1'", for messages

    const YamlNode& node() const { return node_; }
    bool has(const std::string& key);
    std::optional<YamlNode> get(const std::string& key);
    YamlNode at(const std::string& key);  // required
    std::string string_or(const std::string& key, const std::string& fallback);
    int64_t int_or(const std::string& key, int64_t fallback);
    double double_or(const std::string& key, double fallback);
    bool bool_or(const std::string& key, bool fallback);
    void finish() const;  // unknown keys are errors

private:
    // The map's keys in document order, each with its key and value nodes and whether a query
    // named it: a few keys a map, read by a scan (yaml-cpp's lookup converts every key it passes).
    struct Entry {
        std::string key;
        YAML::Node node, value;
        bool asked = false;
    };
    const Entry* find(const std::string& key);  // records the query
    YamlNode node_;
    std::string what_;
    std::vector<Entry> entries_;
    std::vector<std::string> queried_;  // every key asked about, present or not (once each)
};

YamlNode load_yaml_text(const std::string& text, const std::string& name, const YamlLimits& limits = {});
// Text ptool emitted itself (a plan the planner wrote and reads back, hundreds a search): one
// document of plain maps, sequences and scalars by construction, so the passes that guard against a
// hostile file (the nesting prescan, the documents' event pass, the tree check) are skipped and
// only the size limit and yaml-cpp's parse run (they were a third of the planner's plan loading).
// Not for a file.
YamlNode load_emitted_yaml(const std::string& text, const std::string& name);

// The closest candidate by edit distance, or "" when none is close.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

// `doc` with every alias (`*name`) a copy of its own, where it has one (else `doc` itself, marks
// and all): a YAML::Node's assignment writes into the node an alias shares, so a document that is
// edited in place (ptool plan's model variants, shrink's proxy) would change every place that
// names it (a repeat's `count: *r` and the batch's `&r 64` rows). The copies keep each scalar's
// text, tag and each collection's style; their marks are gone.
YAML::Node yaml_unaliased(const YAML::Node& doc);

}  // namespace ptool
