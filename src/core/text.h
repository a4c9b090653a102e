// Small string helpers shared by the config, the command line and the data tools.
#pragma once

#include <string>
#include <vector>

namespace myriad {

// Levenshtein distance.
size_t edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `word`, or "" when none is close enough to be a likely typo.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);
// " (did you mean 'x'?)" or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace myriad
