// ElasticGroup's members, over detail::ElasticMembership (comm/elastic/elastic_membership.hpp).
// Header-only builds include this file at the end of comm/elastic/elastic_group.hpp; with
// COLTRAIN_SEPARATE_COMPILATION only <coltrain/src.hpp> includes it.
#pragma once

#include <coltrain/comm/elastic/elastic_group.hpp>
#include <coltrain/comm/elastic/elastic_membership.hpp>
#include <coltrain/core/config.hpp>

#include <memory>
#include <utility>
#include <vector>

namespace coltrain::comm {

COLTRAIN_DECL ElasticGroup::ElasticGroup(const LaunchEnv& env, CommOptions options,
                                         ElasticOptions elastic)
    : membership_(std::make_unique<detail::ElasticMembership>(env, std::move(options), elastic)) {}
COLTRAIN_DECL ElasticGroup::~ElasticGroup() = default;

COLTRAIN_DECL Communicator& ElasticGroup::communicator() { return membership_->communicator(); }
COLTRAIN_DECL int ElasticGroup::rank() const { return membership_->rank(); }
COLTRAIN_DECL int ElasticGroup::size() const { return membership_->size(); }
COLTRAIN_DECL int ElasticGroup::generation() const { return membership_->generation(); }
COLTRAIN_DECL const ElasticOptions& ElasticGroup::options() const { return membership_->options(); }
COLTRAIN_DECL MembershipChange ElasticGroup::regroup(const std::vector<int>& failed) {
  return membership_->regroup(failed);
}
COLTRAIN_DECL int ElasticGroup::joiners_waiting() { return membership_->joiners_waiting(); }
COLTRAIN_DECL MembershipChange ElasticGroup::admit_joiners() {
  return membership_->admit_joiners();
}
COLTRAIN_DECL bool ElasticGroup::leading() const { return membership_->leading(); }

}  // namespace coltrain::comm
