#include "ingest/sources.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "ingest/checks.h"

namespace patchstore {
namespace fs = std::filesystem;
namespace {

// Splits "x.exr:Z" into ("x.exr", "Z"); other strings are returned whole.
FileRef SplitChannel(const std::string& cell) {
  size_t colon = cell.rfind(':');
  if (colon != std::string::npos && colon >= 4) {
    std::string path = cell.substr(0, colon);
    std::string chan = cell.substr(colon + 1);
    std::string ext = path.substr(path.size() - 4);
    std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
    if (ext == ".exr" && !chan.empty() && chan.find('/') == std::string::npos) return {path, chan};
  }
  return {cell, ""};
}

// Parses one CSV record starting at `pos`; handles quotes and embedded newlines.
bool ParseCsvRecord(const std::string& text, size_t* pos, std::vector<std::string>* cells, std::string* error) {
  cells->clear();
  std::string cell;
  bool quoted = false, was_quoted = false;
  size_t i = *pos;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          cell += '"';
          ++i;
        } else {
          quoted = false;
        }
      } else {
        cell += c;
      }
    } else if (c == '"' && cell.empty() && !was_quoted) {
      quoted = was_quoted = true;
    } else if (c == ',') {
      cells->push_back(cell);
      cell.clear();
      was_quoted = false;
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      ++i;
      break;
    } else {
      cell += c;
    }
  }
  if (quoted) {
    *error = "unterminated quoted cell";
    return false;
  }
  cells->push_back(cell);
  *pos = i;
  return true;
}

}  // namespace

Result<SourceList> ReadManifest(const std::string& manifest_path) {
  PS_RETURN_IF_ERROR(CheckRegularInput(manifest_path, "manifest"));
  std::ifstream in(manifest_path, std::ios::binary);
  if (!in) return Status::NotFound("reading manifest '" + manifest_path + "': cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.size() >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);  // UTF-8 BOM
  const fs::path base = fs::path(manifest_path).parent_path();
  SourceList list;
  size_t pos = 0, line = 0;
  std::vector<std::string> cells;
  std::string error;
  std::set<std::string> seen;
  while (pos < text.size()) {
    ++line;
    if (!ParseCsvRecord(text, &pos, &cells, &error))
      return Status::InvalidArgument("reading manifest '" + manifest_path + "' line " + std::to_string(line) + ": " +
                                     error);
    if (cells.size() == 1 && cells[0].empty()) continue;  // blank line
    if (list.fields.empty()) {
      if (cells.size() < 2 || cells[0] != "id")
        return Status::InvalidArgument("reading manifest '" + manifest_path +
                                       "': the header must read id,<field>,<field>,...");
      for (size_t i = 1; i < cells.size(); ++i) {
        if (cells[i].empty())
          return Status::InvalidArgument("reading manifest '" + manifest_path + "': empty field name in header");
        if (std::find(list.fields.begin(), list.fields.end(), cells[i]) != list.fields.end())
          return Status::InvalidArgument("reading manifest '" + manifest_path + "': field '" + cells[i] +
                                         "' appears twice in the header");
        list.fields.push_back(cells[i]);
      }
      continue;
    }
    if (cells.size() != list.fields.size() + 1)
      return Status::InvalidArgument("reading manifest '" + manifest_path + "' line " + std::to_string(line) +
                                     ": expected " + std::to_string(list.fields.size() + 1) + " cells, found " +
                                     std::to_string(cells.size()));
    SampleSource s;
    s.id = cells[0];
    if (s.id.empty())
      return Status::InvalidArgument("reading manifest '" + manifest_path + "' line " + std::to_string(line) +
                                     ": empty id");
    if (!seen.insert(s.id).second)
      return Status::InvalidArgument("reading manifest '" + manifest_path + "' line " + std::to_string(line) +
                                     ": duplicate id '" + s.id + "'");
    for (size_t i = 1; i < cells.size(); ++i) {
      FileRef ref = SplitChannel(cells[i]);
      fs::path p(ref.path);
      if (p.is_relative()) p = base / p;
      ref.path = p.lexically_normal().string();
      s.files.push_back(ref);
    }
    list.samples.push_back(std::move(s));
  }
  if (list.fields.empty()) return Status::InvalidArgument("reading manifest '" + manifest_path + "': empty");
  return list;
}

namespace {

struct Template {
  std::string field;
  std::string pattern;  // without the ":CHANNEL" suffix
  std::string channel;
  std::vector<std::string> names;     // placeholder names in order of appearance
  std::vector<std::string> literals;  // literals[i] precedes names[i]; one extra at the end
};

Result<Template> ParseTemplate(const std::string& field, const std::string& spec) {
  Template t;
  t.field = field;
  FileRef split = SplitChannel(spec);
  t.pattern = split.path;
  t.channel = split.channel;
  std::string lit;
  for (size_t i = 0; i < t.pattern.size(); ++i) {
    char c = t.pattern[i];
    if (c == '{') {
      size_t end = t.pattern.find('}', i);
      if (end == std::string::npos)
        return Status::InvalidArgument("field '" + field + "': unclosed '{' in template '" + spec + "'");
      std::string name = t.pattern.substr(i + 1, end - i - 1);
      if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") !=
                              std::string::npos)
        return Status::InvalidArgument("field '" + field + "': bad placeholder '{" + name + "}' in '" + spec + "'");
      t.literals.push_back(lit);
      lit.clear();
      t.names.push_back(name);
      i = end;
    } else if (c == '}') {
      return Status::InvalidArgument("field '" + field + "': stray '}' in template '" + spec + "'");
    } else {
      lit += c;
    }
  }
  t.literals.push_back(lit);
  return t;
}

std::string RegexEscape(const std::string& s) {
  static const std::string kSpecial = R"(\^$.|?*+()[]{})";
  std::string out;
  for (char c : s) {
    if (kSpecial.find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

Result<SourceList> FindByTemplates(const std::string& root,
                                   const std::vector<std::pair<std::string, std::string>>& templates,
                                   bool match_folders) {
  if (templates.empty()) return Status::InvalidArgument("no --field templates given");
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return Status::NotFound("searching '" + root + "': no such directory");
  std::vector<Template> ts;
  for (const auto& [field, spec] : templates) {
    for (const Template& t : ts)
      if (t.field == field) return Status::InvalidArgument("field '" + field + "' given twice");
    PS_ASSIGN_OR_RETURN(Template t, ParseTemplate(field, spec));
    ts.push_back(std::move(t));
  }
  const Template& first = ts[0];
  if (first.names.empty())
    return Status::InvalidArgument("field '" + first.field + "': the template '" + first.pattern +
                                   "' needs at least one {placeholder} to tell samples apart");
  std::set<std::string> first_names(first.names.begin(), first.names.end());
  for (size_t i = 1; i < ts.size(); ++i)
    for (const std::string& n : ts[i].names)
      if (!first_names.count(n))
        return Status::InvalidArgument("field '" + ts[i].field + "': placeholder '{" + n +
                                       "}' does not appear in "
                                       "the template of field '" +
                                       first.field + "'");
  // The matcher of a template: literals escaped, the first occurrence of a
  // name captures one path component (no '/'), later ones must repeat it.
  auto matcher_of = [](const Template& t, std::map<std::string, int>* group) {
    std::string re = "^";
    int groups = 0;
    for (size_t i = 0; i < t.names.size(); ++i) {
      re += RegexEscape(t.literals[i]);
      auto it = group->find(t.names[i]);
      if (it == group->end()) {
        (*group)[t.names[i]] = ++groups;
        re += "([^/]+)";
      } else {
        re += "\\" + std::to_string(it->second);
      }
    }
    return std::regex(re + RegexEscape(t.literals.back()) + "$");
  };
  std::map<std::string, int> group;
  std::regex matcher = matcher_of(first, &group);
  // Later fields with the first's placeholders: a file of theirs whose
  // sample has no file of the first field is named (it is not ingested).
  struct Other {
    const Template* t;
    std::map<std::string, int> group;
    std::regex matcher;
  };
  std::vector<Other> others;
  for (size_t i = 1; i < ts.size(); ++i)
    if (std::set<std::string>(ts[i].names.begin(), ts[i].names.end()) == first_names) {
      Other o{&ts[i], {}, {}};
      o.matcher = matcher_of(ts[i], &o.group);
      others.push_back(std::move(o));
    }
  std::map<std::string, std::pair<std::string, std::string>> other_ids;  // id -> (field, path), first seen

  std::vector<std::pair<std::vector<std::string>, SampleSource>> found;
  const fs::path rootp(root);
  for (auto it = fs::recursive_directory_iterator(rootp, fs::directory_options::follow_directory_symlink, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const bool folder = match_folders && it->is_directory(ec);
    if (!folder && !it->is_regular_file(ec)) continue;
    const std::string rel = it->path().lexically_relative(rootp).generic_string();
    std::smatch m;
    if (!std::regex_match(rel, m, matcher)) {
      for (Other& o : others) {
        std::smatch om;
        if (!std::regex_match(rel, om, o.matcher)) continue;
        std::string id;
        std::set<std::string> done;
        for (const std::string& n : first.names)
          if (done.insert(n).second) id += (id.empty() ? "" : "/") + om[o.group[n]].str();
        other_ids.emplace(id, std::make_pair(o.t->field, rel));
        break;
      }
      continue;
    }
    if (folder) it.disable_recursion_pending();
    std::map<std::string, std::string> values;
    std::vector<std::string> ordered;
    for (const std::string& n : first.names) {
      if (values.count(n)) continue;
      values[n] = m[group[n]].str();
      ordered.push_back(values[n]);
    }
    SampleSource s;
    for (size_t k = 0; k < ordered.size(); ++k) s.id += (k ? "/" : "") + ordered[k];
    for (const Template& t : ts) {
      std::string path;
      for (size_t i = 0; i < t.names.size(); ++i) path += t.literals[i] + values[t.names[i]];
      path += t.literals.back();
      s.files.push_back({(rootp / path).lexically_normal().string(), t.channel});
    }
    found.emplace_back(std::move(ordered), std::move(s));
  }
  if (ec) return Status::IOError("searching '" + root + "': " + ec.message());
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  SourceList list;
  for (const Template& t : ts) list.fields.push_back(t.field);
  std::set<std::string> ids;
  for (auto& [key, s] : found) {
    if (!ids.insert(s.id).second)
      return Status::InvalidArgument("searching '" + root + "': two files give the id '" + s.id + "'");
    list.samples.push_back(std::move(s));
  }
  std::vector<std::string> orphans;
  for (const auto& [id, where] : other_ids)
    if (!ids.count(id)) orphans.push_back("'" + id + "' ('" + where.second + "' of field '" + where.first + "')");
  if (!orphans.empty()) {
    std::string shown;
    for (size_t i = 0; i < orphans.size() && i < 3; ++i) shown += (i ? ", " : "") + orphans[i];
    list.warnings.push_back(std::to_string(orphans.size()) + " sample(s) under '" + root + "' have files of other " +
                            "fields but none matching the first field's template '" + first.pattern + "' (field '" +
                            first.field + "', which defines the samples), so they are not ingested: " + shown +
                            (orphans.size() > 3 ? ", ..." : ""));
  }
  return list;
}

}  // namespace patchstore
